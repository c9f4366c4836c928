"""An address where no Ray answers is refused in one line, exit 2, before ray.init
(orchestrator/execute/ray_address.py).
Issue 40: `specdrill deploy --check --address 127.0.0.1:1` ran past 120 s printing Ray's raw rpc warnings. A real
cluster still connects through the same check: tests/serve_apps/test_serve_sim.py deploys by its GCS address."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.execute.ray_address import why_unreachable
from tests import REPO
from tests.hub_cache import offline_sharegpt

EXAMPLE = str(REPO / "examples" / "sim-campaign.yaml")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def not_ray() -> Iterator[str]:
    """A loopback HTTP server: it accepts connections, and is no Ray GCS."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.integration  # a specdrill process
def test_deploy_check_at_an_address_where_nothing_listens_fails_at_once_in_one_line() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    done = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "deploy", "--check", "--address", address,
         EXAMPLE],
        capture_output=True, text=True, timeout=60, check=False,  # before the fix: past 120 s, so this timed out
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"specdrill: error: no Ray cluster at '{address}': Connection refused: start one (infra/ray-up.sh or "
        "`ray start --head`) or give the address it prints (--address or RAY_ADDRESS)"
    ]  # one line: none of Ray's rpc_client / gcs_client warnings
    assert done.stdout == ""


@pytest.mark.integration  # a server on a loopback port
def test_an_address_that_answers_but_is_not_ray_is_named_so(not_ray: str) -> None:
    reason = why_unreachable(not_ray)
    assert reason is not None and reason.startswith(
        f"no Ray cluster at '{not_ray}': it accepts connections but no Ray GCS"
    )


@pytest.mark.parametrize("command", ["deploy", "teardown", "run", "models pull"])
def test_every_command_that_connects_refuses_an_unreachable_address_with_exit_2(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline_sharegpt(monkeypatch, tmp_path)  # the GPU campaign's ShareGPT data set, as the Hub cache holds it
    address = f"127.0.0.1:{_closed_port()}"
    campaign = {"teardown": [], "models pull": [str(REPO / "campaigns" / "gpu-llama3.1-8b-eagle.yaml")]}
    result = CliRunner().invoke(cli, [*command.split(), "--address", address, *campaign.get(command, [EXAMPLE])])
    assert result.exit_code == 2, result.output
    assert f"no Ray cluster at '{address}': Connection refused" in result.output


def test_addresses_ray_resolves_itself_are_left_to_it_and_a_malformed_one_is_named() -> None:
    assert why_unreachable("auto") is None and why_unreachable("local") is None
    assert why_unreachable("head-node") == "Ray address 'head-node': expected host:port (or ray://host:port, auto)"


def test_the_gcs_call_the_check_makes_is_in_the_installed_ray() -> None:
    """ray.core.generated is Ray's private protocol: the day an upgrade renames GetClusterId, this fails (the check
    itself then leaves the address to ray.init, as before issue 40)."""
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    assert hasattr(gcs_service_pb2, "GetClusterIdRequest")
    assert hasattr(gcs_service_pb2_grpc.NodeInfoGcsServiceStub, "__init__")
    assert "GetClusterId" in gcs_service_pb2.DESCRIPTOR.services_by_name["NodeInfoGcsService"].methods_by_name
