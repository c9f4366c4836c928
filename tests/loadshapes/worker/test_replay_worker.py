"""A replayed BurstGPT window sent by a real load worker (Locust in a child process) to a scripted server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from loadshapes.mixes import MixEntry, RequestMix
from loadshapes.null_server import NullConfig, NullServer, ServerThread
from loadshapes.plan import Target, WorkerPlan, open_loop_schedule
from loadshapes.replayed import CategoryRule
from loadshapes.shapes import Replay
from loadshapes.trace import read_traces
from orchestrator.execute.load_workers import LocustProcess
from timebase.clock import now_ns


class RecordingServer(NullServer):
    """The null server, keeping each body, and refusing max_tokens < 1 as vLLM and the arms' server do."""

    def __init__(self) -> None:
        super().__init__(NullConfig(chunks=2, tokens_per_chunk=1))
        self.bodies: dict[str, dict[str, Any]] = {}

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies[request.headers["x-request-id"]] = body
        if body["max_tokens"] < 1:
            message = "max_tokens: Input should be greater than or equal to 1"
            return web.json_response({"error": {"message": message}}, status=400)
        return await super().completions(request)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    thread = ServerThread(RecordingServer())
    yield thread
    thread.stop()


def test_a_worker_sends_the_recorded_lengths_at_the_recorded_times(server: ServerThread, tmp_path: Path) -> None:
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for i in range(24):
        response = 0 if i == 5 else 3 + i
        lines.append(f"{100 + i * 0.05:.2f},{'GPT-4' if i % 3 == 0 else 'ChatGPT'},{40 + i},{response},0,API log")
    path = tmp_path / "burst.csv"
    path.write_text("\n".join(lines) + "\n")
    shape = Replay(path=str(path), failed="expect_error", category=CategoryRule(by="model", map={"GPT-4": "editing"},
                                                                                default="chat"))  # fmt: skip
    plan = WorkerPlan(
        campaign="t", run="r1", arm="a", shape_name="s", shape=shape, worker=1, workers=2, drain_s=10,
        mix=RequestMix(entries=[MixEntry(workload="chat", weight=1)]), target=Target(base_url=server.url, model="m"),
        trace_root=str(tmp_path / "traces"),
    )  # fmt: skip
    process = LocustProcess(plan, str(tmp_path / "w"))
    process.start()
    try:
        process.wait_ready(60)
        process.go(now_ns() + 500_000_000)
        summary = process.wait(60)
    finally:
        process.stop()

    expected = {plan.request_id(p.index): p for p in open_loop_schedule(plan)}
    assert sorted(expected) == sorted(plan.request_id(i) for i in range(1, 24, 2))  # worker 1 of 2: odd requests
    table = read_traces(str(tmp_path / "traces"))
    assert summary.scheduled == table.num_rows == len(expected)
    recorder = server.server
    assert isinstance(recorder, RecordingServer)
    bodies = recorder.bodies
    for row in table.to_pylist():
        planned = expected[row["request_id"]]
        i = planned.index
        body = bodies[row["request_id"]]
        assert row["offset_s"] == pytest.approx(i * 0.05) and row["category"] == planned.spec.category
        assert body["specdrill"]["prompt_tokens"] == 40 + i == len(body["prompt"].split())
        if i == 5:  # recorded as failed: replayed, refused, and recorded as the error it expects
            assert (row["category"], body["max_tokens"], row["status"]) == ("failed", 0, "error")
            assert row["error_class"] == "http_400" and "ignore_eos" not in body
        else:
            assert (body["max_tokens"], body["ignore_eos"], row["status"]) == (3 + i, True, "ok")
            assert row["category"] == ("editing" if i % 3 == 0 else "chat")
