"""Sessions in the load worker (Locust in a child process) against the null streaming server: each later turn is
sent after its predecessor's answer plus the think time, carries that answer, and what falls after the shape's
end is counted, not sent."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadshapes.mixes import RequestMix
from loadshapes.null_server import NullConfig, NullServer, ServerThread
from loadshapes.plan import Target, WorkerPlan, open_loop_schedule
from loadshapes.sessions import SEPARATOR, turn_index
from loadshapes.shapes import Concurrency, Quiet
from loadshapes.trace import read_traces
from orchestrator.execute.load_workers import LocustProcess
from orchestrator.execute.progress import unit_line
from orchestrator.rundir.layout import Unit, UnitResult
from orchestrator.rundir.worker_summary import WorkerSummary
from timebase.clock import now_ns

THINK_S = 0.3
THINK_NS = 300_000_000
ANSWER = " tok" * 4  # the null server's answer: 2 chunks of 2 tokens


def _conversations(path: Path, n: int = 12) -> Path:
    """Three user turns each, every reply 6 words long."""
    entries = [
        {"id": f"c{i}", "conversations": [
            {"from": "human", "value": f"Question {i} about the sea and the waves"}, {"from": "gpt", "value": "w " * 6},
            {"from": "human", "value": f"And the tides of {i}?"}, {"from": "gpt", "value": "w " * 6},
            {"from": "human", "value": f"Why {i}?"}, {"from": "gpt", "value": "w " * 6},
        ]}
        for i in range(n)
    ]  # fmt: skip
    path.write_text(json.dumps(entries))
    return path


@pytest.fixture
def server() -> Iterator[ServerThread]:
    thread = ServerThread(NullServer(NullConfig(chunks=2, tokens_per_chunk=2, chunk_delay_s=0.02)))
    yield thread
    thread.stop()


def _run(plan: WorkerPlan, workdir: Path) -> dict[str, Any]:
    process = LocustProcess(plan, str(workdir))
    process.start()
    try:
        process.wait_ready(60)
        process.go(now_ns() + 500_000_000)
        process.wait(60)
    finally:
        process.stop()
    assert plan.summary_file is None  # the process's own summary file: read beside it
    [summary] = list(workdir.glob("*.summary.json"))
    data: dict[str, Any] = json.loads(summary.read_text())
    return data


def _plan(url: str, tmp_path: Path, endpoint: str, **extra: Any) -> WorkerPlan:
    mix = {"dataset": str(_conversations(tmp_path / "c.json")), "sessions": {"think_time_s": THINK_S}}
    fields: dict[str, Any] = {
        "campaign": "t", "run": "r", "arm": "a", "shape_name": "s", "shape": Quiet(rate=6, duration_s=2.5),
        "mix": RequestMix.model_validate(mix), "target": Target(base_url=url, model="null", endpoint=endpoint),
        "trace_root": str(tmp_path / "traces"), "drain_s": 10, "store_prompts": True, **extra,
    }  # fmt: skip
    return WorkerPlan.model_validate(fields)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_open_loop_sessions_send_each_turn_after_the_answer_with_the_history(
    server: ServerThread, tmp_path: Path, endpoint: str
) -> None:
    plan = _plan(server.url, tmp_path, endpoint)
    arrivals = open_loop_schedule(plan)
    summary = _run(plan, tmp_path / "w")
    rows = read_traces(str(tmp_path / "traces")).to_pylist()
    by_key = {(r["session_id"], r["turn"]): r for r in rows}
    assert {r["status"] for r in rows} == {"ok"} and len(by_key) == len(rows)
    first = [r for r in rows if r["turn"] == 1]
    assert sorted(r["request_index"] for r in first) == [p.index for p in arrivals]  # the arrivals: turn 1 each
    later = [r for r in rows if r["turn"] > 1]
    assert later, "some sessions reached a second turn"
    user = {p.index: p.spec.prompt for p in arrivals}
    for row in later:
        before = by_key[(row["session_id"], row["turn"] - 1)]
        assert row["request_index"] == turn_index(row["session_id"], row["turn"])
        # Sent the think time after the previous answer ended (and not before)
        assert row["scheduled_ns"] >= before["done_ns"] + THINK_NS
        assert row["sent_ns"] - before["done_ns"] < (THINK_S + 0.25) * 1e9
        # Its prompt: the previous prompt, the answer the server sent, then the data set's next user turn.
        opening = user[row["session_id"]]
        n = opening.split()[1]  # the conversation drawn for this arrival: "Question {n} about ..."
        asked = ("And the tides of", "Why")[row["turn"] - 2]
        assert row["prompt"] == before["prompt"] + ANSWER + SEPARATOR + f"{asked} {n}?"
        assert row["prompt"].startswith(opening + ANSWER + SEPARATOR)
        assert row["prompt_tokens"] > before["prompt_tokens"]  # the null server counts words: the history grew
    # A later turn whose time falls after the shape's end is not sent: counted, no row.
    not_sent = summary["session_turns_not_sent"]
    sessions_left = {r["session_id"]: r["turn"] for r in rows}
    assert not_sent["after_end"] == sum(3 - t for t in sessions_left.values()) > 0
    assert not_sent["after_failure"] == not_sent["at_stop"] == 0
    assert summary["session_turns_sent"] == len(later)
    assert summary["scheduled"] == summary["rows_written"] == len(rows) == len(arrivals) + len(later)
    # What the run keeps of it (the unit's result) and the unit's line say the same.
    worker = WorkerSummary.model_validate(summary)
    assert (worker.session_turns_sent, worker.session_turns_not_sent) == (len(later), not_sent)
    result = UnitResult(unit=Unit(arm="a", shape="s", repeat=0), start_ns=0, end_ns=1, duration_s=2.5,
                        scheduled=worker.scheduled, rows=len(rows), saturated=False, lateness_p99_s=0.0,
                        workers=[worker], timeline_steps=0)  # fmt: skip
    line = unit_line(result.unit, result, 1, 1)
    assert line.endswith(
        f"session_turns_sent={len(later)} session_turns_not_sent={not_sent['after_end']} "
        f"(after_end {not_sent['after_end']})"
    )


def test_a_closed_loop_user_plays_its_session_before_its_next_one(server: ServerThread, tmp_path: Path) -> None:
    plan = _plan(server.url, tmp_path, "completions", shape=Concurrency(users=1, duration_s=2.5))
    summary = _run(plan, tmp_path / "w")
    rows = sorted(read_traces(str(tmp_path / "traces")).to_pylist(), key=lambda r: r["sent_ns"])
    turns = [(r["session_id"], r["turn"]) for r in rows]
    # Turn 1, 2, 3 of session 0, then session 1 from its first turn, ...
    assert turns[:4] == [(0, 1), (0, 2), (0, 3), (1, 1)]
    for previous, row in itertools.pairwise(rows):
        if row["turn"] > 1:
            assert row["scheduled_ns"] >= previous["done_ns"] + THINK_NS
            assert row["prompt"].startswith(previous["prompt"] + ANSWER + SEPARATOR)
    assert summary["scheduled"] == len(rows) == summary["sent"]
