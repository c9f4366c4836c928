"""Contracts with the private APIs of dependencies that specdrill relies on, each pinned to a tested version range
in pyproject.toml. An upgrade that breaks one fails here with a message naming what changed and where specdrill
uses it, instead of failing mid-campaign."""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# distribution -> why its range is pinned (the private API specdrill uses)
PINNED = {
    "ray": "Serve's replica module (serve_apps/deployment.py) and serve.context._get_global_client (deploy.py)",
    "geventhttpclient": "its llhttp parser's callbacks and HTTPResponse internals (loadshapes/http_framing.py)",
}


def _requirement(name: str) -> Requirement:
    for text in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(text)
        if requirement.name == name:
            return requirement
    raise AssertionError(f"pyproject.toml does not list {name}")


@pytest.mark.parametrize("name", sorted(PINNED))
def test_dependencies_with_private_apis_are_pinned_to_the_tested_range(name: str) -> None:
    requirement = _requirement(name)
    bounds = {spec.operator for spec in requirement.specifier}
    assert "<" in bounds or "==" in bounds, f"{name}: pin an upper bound in pyproject.toml ({PINNED[name]})"
    installed = Version(version(name))
    assert installed in requirement.specifier, (
        f"{name} {installed} is outside the tested range {requirement.specifier} in pyproject.toml; it is pinned "
        f"because specdrill uses {PINNED[name]}: run this suite against it, then widen the range"
    )


def test_ray_serve_replica_binds_its_internal_grpc_server_through_add_port_to_grpc_server() -> None:
    """serve_apps/deployment.py keeps the replicas' inter-deployment gRPC server on loopback by wrapping it."""
    from ray.serve._private import replica

    bind = getattr(replica, "add_port_to_grpc_server", None)
    assert callable(bind), (
        "ray.serve._private.replica.add_port_to_grpc_server is gone: serve_apps/deployment.py "
        "keep_internal_grpc_on_loopback can no longer keep the replicas' gRPC server on 127.0.0.1"
    )
    assert list(inspect.signature(bind).parameters) == ["server", "address"]
    source = inspect.getsource(replica)
    assert re.search(r'add_port_to_grpc_server\(\s*self\._server,\s*"\[::\]:0"\s*\)', source), (
        'Ray Serve no longer binds its replica gRPC server with add_port_to_grpc_server(self._server, "[::]:0"): '
        "check how it binds now and update keep_internal_grpc_on_loopback"
    )


def test_ray_serve_global_client_exposes_the_http_config() -> None:
    """orchestrator/execute/deploy.py reads the HTTP address Serve already listens on (one Serve per cluster)."""
    from ray.serve._private.client import ServeControllerClient
    from ray.serve.context import _get_global_client

    assert "raise_if_no_controller_running" in inspect.signature(_get_global_client).parameters
    assert isinstance(inspect.getattr_static(ServeControllerClient, "http_config"), property), (
        "ServeControllerClient.http_config is gone: deploy._check_listening cannot read Serve's address"
    )


def test_geventhttpclient_parser_calls_the_callbacks_wire_relies_on() -> None:
    """loadshapes/http_framing.py subclasses the llhttp parser to find where each response ends."""
    from geventhttpclient._parser import HTTPParseError, HTTPResponseParser

    calls: list[str] = []

    class Recorder(HTTPResponseParser):
        def _on_message_begin(self) -> None:
            calls.append("begin")

        def _on_status(self, status: str) -> None:
            calls.append("status")

        def _on_header_field(self, name: str) -> None:
            calls.append("field")

        def _on_header_value(self, value: str) -> None:
            calls.append("value")

        def _on_headers_complete(self) -> bool:
            calls.append("headers")
            return False

        def _on_body(self, data: bytearray) -> None:
            calls.append("body")

        def _on_message_complete(self) -> None:
            calls.append("complete")

    parser = Recorder()
    parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    assert calls[0] == "begin" and calls[-1] == "complete"
    assert {"status", "field", "value", "headers", "body"} <= set(calls), calls
    with pytest.raises(HTTPParseError):
        Recorder().feed(b"not http at all\r\n\r\n")


def test_geventhttpclient_response_keeps_the_body_in_a_buffer_that_decode_response_drains() -> None:
    from geventhttpclient.response import HTTPResponse

    from loadshapes.http_framing import decode_response

    response = HTTPResponse("POST")
    assert isinstance(response._body_buffer, bytearray), (
        "HTTPResponse._body_buffer changed: see http_framing.decode_response"
    )
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    decoded = decode_response([raw[:50], raw[50:]], [1, 2])
    assert decoded is not None and decoded.status == 200 and decoded.complete
    assert b"".join(decoded.body) == b"abcde"


@pytest.mark.vllm
def test_vllm_helpers_the_placement_probe_and_the_step_timeline_use() -> None:
    """serve_apps/engines/placement_probe.py calls vLLM's DP device mapping through the module's platform global;
    serve_apps/engines/vllm_stats.py subclasses StatLoggerBase to see every engine step."""
    from vllm.platforms.interface import Platform
    from vllm.v1.engine import utils
    from vllm.v1.metrics.loggers import StatLoggerBase

    assert hasattr(utils, "current_platform"), "vllm.v1.engine.utils no longer imports current_platform"
    parameters = list(inspect.signature(utils.get_physical_gpu_ids_for_local_dp_rank).parameters)
    assert parameters[:3] == ["device_control_env_var", "local_dp_rank", "world_size"], parameters
    assert callable(Platform.device_id_to_physical_device_id)
    record = list(inspect.signature(StatLoggerBase.record).parameters)
    assert record[:3] == ["self", "scheduler_stats", "iteration_stats"], record
    assert "engine_idx" in record
