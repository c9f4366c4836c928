"""`warmup: {requests: N}` sends exactly N unmeasured requests to an arm before its units; none with 0."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from orchestrator.execute.ray_executor import warm
from serve_apps.arms import ArmSpec
from serve_apps.engine_kinds.simulated import SimulatedEngineConfig
from serve_apps.policies import OffPolicy

pytestmark = pytest.mark.integration  # a server on a loopback port

INFO = {"configured_speculative_config": None, "resolved_speculative_config": None, "engine_kind": "simulated"}


class _Counting(BaseHTTPRequestHandler):
    posts: ClassVar[list[str]] = []
    info_served: ClassVar[bool] = True

    def _answer(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        type(self).posts.append(self.path)
        self._answer(200, {"choices": [{"text": "x"}], "specdrill": {**INFO, "engine_kind": "from a request"}})

    def do_GET(self) -> None:
        if self.path == "/specdrill/info" and type(self).info_served:
            self._answer(200, INFO)
        else:
            self._answer(404, {"detail": "not found"})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Counting.posts = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


ARM = ArmSpec(name="off-single", policy=OffPolicy(), engine=SimulatedEngineConfig())


def test_zero_warmup_requests_send_none_and_read_what_the_arm_runs_from_its_info(server: str) -> None:
    _Counting.info_served = True
    assert warm(server, ARM, 0) == INFO
    assert _Counting.posts == []
    _Counting.info_served = False  # a foreign server: nothing to read, still nothing sent
    assert warm(server, ARM, 0) == {}
    assert _Counting.posts == []


def test_n_warmup_requests_send_n(server: str) -> None:
    assert warm(server, ARM, 3)["engine_kind"] == "from a request"
    assert _Counting.posts == ["/v1/completions"] * 3
