"""A fourth dialect added by one module's worth of declaration (and registering its kind): a server that reports
each request's verify steps under `toyext.steps` when asked by a header, and counts them as `toy_verify_steps`.
Nothing else in specdrill changes: the load worker asks and reads, the scraper samples, the verifier reconciles."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from aiohttp import web
from prometheus_client import Counter, Gauge

from serve_apps.engine_kinds.dialects.base import Dialect, RequestFormat
from serve_apps.engine_kinds.endpoint import EndpointEngineConfig, EndpointKind
from serve_apps.engine_kinds.registry import register, unregister
from tests.serve_apps.engine_kinds.dialects.endpoint_mode import endpoint_unit
from tests.serve_apps.engine_kinds.dialects.servers import DialectServer, serve

pytestmark = [pytest.mark.integration]

# --- the module a fourth dialect is: its declaration and its kind ------------------------------------------------
TOY = Dialect(
    name="toy",
    request=RequestFormat(headers={"X-Toy-Spec": "1"}, fields={"spec_steps": "toyext.steps"}),
    running="toy_running",
    waiting="toy_waiting",
    counters={"num_drafts": "toy_verify_steps_total"},
    speculation="toy_verify",
    metrics_path="/toy/metrics",
    reconciles=(("spec_steps", "num_drafts"),),
    steps="none",
    steps_note="the toy server reports steps per request as a total only",
)


class ToyEndpointConfig(EndpointEngineConfig):
    kind: Literal["toy"] = "toy"  # type: ignore[assignment]


class ToyEndpointKind(EndpointKind):
    name = "toy"
    config = ToyEndpointConfig
    dialect = TOY


# ------------------------------------------------------------------------------------------------------------------


class ToyServer(DialectServer):
    metrics_path = "/toy/metrics"

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0
        self.running_gauge = Gauge("toy_running", "", registry=self.registry)
        self.verify = Counter("toy_verify_steps_total", "", registry=self.registry)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.asked += request.headers.get("X-Toy-Spec") == "1"
        return await super().completions(request)

    def finished(self, request: dict[str, Any], verify: int, steps: int) -> list[bytes]:
        self.verify.inc(verify)
        usage = self.usage(5, request["_n"])
        return [self.chunk(request["_id"], request["_created"], [], usage=usage, toyext={"steps": verify})]


@pytest.fixture
def toy_kind() -> Iterator[None]:
    register(ToyEndpointKind())
    try:
        yield
    finally:
        unregister("toy")


def test_a_fourth_dialect_declared_in_one_module_is_asked_sampled_and_reconciled(
    toy_kind: None, tmp_path: Path
) -> None:
    server = ToyServer()
    thread = serve(server)
    try:
        result = endpoint_unit("toy", thread.url, tmp_path).arms[0]
    finally:
        thread.stop()
    found = {f.check: f for f in result.findings}
    assert server.asked > 0  # every request carried the dialect's header
    assert found["reconciliation"].status == "pass", found["reconciliation"].message
    assert found["reconciliation"].message.endswith(" drafts")
    assert found["executed_k"].status == "not_verifiable"
    assert "the toy server reports steps per request as a total only" in found["executed_k"].message
