"""The load worker (Locust in a child process) against the null streaming server: open loop, errors as rows."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest

from loadshapes.mixes import MixEntry, RequestMix
from loadshapes.null_server import NullConfig, NullServer, ServerThread
from loadshapes.plan import Target, WorkerPlan, open_loop_schedule
from loadshapes.shapes import Concurrency, Quiet, Step
from loadshapes.sse import StreamError, StreamResult, body_lines, latency_columns
from loadshapes.trace import read_traces
from orchestrator.execute.load_workers import LocustProcess
from orchestrator.rundir.worker_summary import WorkerSummary
from tests import raw_client
from timebase.clock import now_ns

CHAT = RequestMix(entries=[MixEntry(workload="chat", weight=1)])


def _plan(url: str, root: Path, **extra: Any) -> WorkerPlan:
    fields: dict[str, Any] = {
        "campaign": "t", "run": "r1", "arm": "a", "shape_name": "s", "shape": Quiet(rate=20, duration_s=2),
        "mix": CHAT, "target": Target(base_url=url, model="null"), "trace_root": str(root), "drain_s": 10,
        **extra,
    }  # fmt: skip
    return WorkerPlan.model_validate(fields)


def _run(plan: WorkerPlan, workdir: Path, *, lead_s: float = 0.5, timeout_s: float = 60) -> WorkerSummary:
    process = LocustProcess(plan, str(workdir))
    process.start()
    try:
        process.wait_ready(60)
        process.go(now_ns() + round(lead_s * 1e9))
        return process.wait(timeout_s)
    finally:
        process.stop()


# Send lateness is judged against the raw client's (tests/raw_client.py) in the same run: at most LATE_RATIO times
# its, or LATE_FLOOR_S where it is below timer resolution (both in the bench's terms: benchmarks/bench_loadgen.py
# holds the worker to p99 <= 1 ms on a quiet host, where absolute thresholds belong). Issue 40: fixed 50 ms bounds
# failed on a busy shared 2-core host.
LATE_RATIO = 5.0
LATE_FLOOR_S = 0.010


def late_bound(raw: float) -> float:
    return max(LATE_RATIO * float(raw), LATE_FLOOR_S)


def _run_beside_the_raw_client(
    plan: WorkerPlan, workdir: Path, url: str, *, lead_s: float = 2.0
) -> tuple[WorkerSummary, np.ndarray]:
    """The worker and the raw client on the same schedule, from the same start, against the same server."""
    process = LocustProcess(plan, str(workdir))
    process.start()
    try:
        process.wait_ready(60)
        start = now_ns() + round(lead_s * 1e9)  # the raw client's process starts in the lead
        raw = raw_client.start(url + "/v1/completions", start, [p.offset_s for p in open_loop_schedule(plan)])
        process.go(start)
        summary = process.wait(60)
        return summary, raw_client.lateness(raw)
    finally:
        process.stop()


@pytest.fixture
def server() -> Iterator[ServerThread]:
    thread = ServerThread(NullServer(NullConfig(chunks=4, tokens_per_chunk=1)))
    yield thread
    thread.stop()


def _configure(server: ServerThread, **changes: Any) -> None:
    request = urllib.request.Request(
        server.url + "/null/config", data=json.dumps(changes).encode(), headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=5).read()


# --- pure parts -----------------------------------------------------------------------------------------------


def test_multi_token_chunks_give_every_token_its_arrival_time() -> None:
    result = StreamResult()
    t0 = 1_000_000_000
    chunks = [(3, t0 + 10_000_000), (4, t0 + 30_000_000), (1, t0 + 50_000_000)]  # cumulative usage 3, 7, 8
    total = 0
    for tokens, t in chunks:
        total += tokens
        usage = {"prompt_tokens": 5, "completion_tokens": total}
        result.feed(
            f'data: {{"choices":[{{"index":0,"text":"x","finish_reason":null}}],"usage":{json.dumps(usage)}}}', t
        )
    result.feed(
        'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":8},"specdrill":{"queue_wait_s":0.25}}',
        t0 + 51_000_000,
    )
    result.feed("data: [DONE]", t0 + 52_000_000)
    result.check_complete()
    assert result.token_times_ns == [t0 + 10_000_000] * 3 + [t0 + 30_000_000] * 4 + [t0 + 50_000_000]
    assert result.output_tokens == 8 and result.prompt_tokens == 5 and result.telemetry == {"queue_wait_s": 0.25}
    columns = latency_columns(t0, result, t0 + 52_000_000)
    assert columns["ttft_s"] == pytest.approx(0.010)  # from the scheduled time t0
    assert columns["tpot_s"] == pytest.approx(0.040 / 7)  # 8 tokens, 7 gaps, 40 ms from first to last
    assert columns["itl_max_s"] == pytest.approx(0.020) and columns["itl_p50_s"] == 0.0
    assert columns["e2e_s"] == pytest.approx(0.052)


def test_body_pieces_become_lines_with_the_arrival_time_of_their_end() -> None:
    # One socket read may carry several events, and an event may be split across reads.
    pieces = [b'data: {"a":1}\n\ndata: {"b"', b":2}\r\n\r\n", b"data: [DONE]\n\n", b"data: tail"]
    times = [10, 20, 30, 40]
    lines = list(body_lines(pieces, times))
    assert lines == [
        (b'data: {"a":1}', 10), (b"", 10), (b'data: {"b":2}\r', 20), (b"\r", 20),
        (b"data: [DONE]", 30), (b"", 30), (b"data: tail", 40),
    ]  # fmt: skip
    # Fed to the parser, a whole stream read in one piece gives each token that piece's time.
    result = StreamResult()
    usage = '"usage":{"prompt_tokens":2,"completion_tokens":%d}'
    body = "".join(f'data: {{"choices":[{{"index":0,"text":"x"}}],{usage % n}}}\n\n' for n in (1, 3))
    for line, t in body_lines([body.encode() + b"data: [DONE]\n\n"], [7]):
        result.feed(line, t)
    result.check_complete()
    assert result.token_times_ns == [7, 7, 7] and result.output_tokens == 3


def test_chat_deltas_without_usage_count_one_token_each() -> None:
    result = StreamResult()
    result.feed('data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}', 1)
    result.feed('data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}', 2)
    result.feed('data: {"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}', 3)
    assert result.token_times_ns == [2, 3] and result.finish_reason == "stop"
    with pytest.raises(StreamError, match="before data: \\[DONE\\]"):
        result.check_complete()
    result.feed("data: [DONE]", 4)
    with pytest.raises(StreamError) as missing:
        result.check_complete()
    assert missing.value.kind == "missing_usage"
    with pytest.raises(StreamError) as bad:
        result.feed("data: {oops", 5)
    assert bad.value.kind == "invalid_json"


def test_schedule_is_the_same_for_any_split_and_any_arm(tmp_path: Path) -> None:
    shape = Step(rates=[5, 40, 10], step_s=3)
    whole = open_loop_schedule(_plan("http://127.0.0.1:1", tmp_path, shape=shape, seed=3))
    parts = [
        item
        for w in range(3)
        for item in open_loop_schedule(
            _plan("http://127.0.0.1:1", tmp_path, shape=shape, seed=3, worker=w, workers=3, arm="b")
        )
    ]  # fmt: skip
    assert sorted((p.index, p.offset_s, p.spec, p.phase) for p in parts) == [
        (p.index, p.offset_s, p.spec, p.phase) for p in whole
    ]
    other_seed = open_loop_schedule(_plan("http://127.0.0.1:1", tmp_path, shape=shape, seed=4))
    assert [p.offset_s for p in other_seed] != [p.offset_s for p in whole]


# --- the Locust process ---------------------------------------------------------------------------------------


def test_open_loop_rows_equal_requests_and_tokens_are_counted(server: ServerThread, tmp_path: Path) -> None:
    _configure(server, chunks=5, tokens_per_chunk=3, chunk_delay_s=0.01)
    plan = _plan(server.url, tmp_path / "traces", shape=Quiet(rate=30, duration_s=2), workers=2, worker=1, flush_rows=7)
    summary = _run(plan, tmp_path / "w")
    table = read_traces(str(tmp_path / "traces"))
    expected = open_loop_schedule(plan)
    assert summary.scheduled == len(expected) == table.num_rows == summary.rows_written > 10
    assert sorted(table.column("request_id").to_pylist()) == sorted(plan.request_id(p.index) for p in expected)
    assert set(table.column("status").to_pylist()) == {"ok"}
    assert set(table.column("output_tokens").to_pylist()) == {15}
    assert all(len(t) == 15 for t in table.column("token_times_ns").to_pylist())
    tpot = np.array(table.column("tpot_s").to_pylist())
    times = table.column("token_times_ns").to_pylist()
    np.testing.assert_allclose(tpot, [(t[-1] - t[0]) / 1e9 / 14 for t in times], rtol=1e-12)  # from the stream
    # 4 chunk gaps of >= 10 ms over 14 token gaps as the server sends them; the client's read times can bunch a
    # row's chunks when the host is busy (seen once in a clean-clone run at load ~8), so the bound holds for the
    # typical row, not every one.
    assert np.all(tpot > 0) and np.median(tpot) > 0.01 * 4 / 14 * 0.9
    assert set(table.column("worker").to_pylist()) == {1}
    assert table.column("phase").unique().to_pylist() == ["quiet"]
    scheduled = np.array(table.column("scheduled_ns").to_pylist())
    offsets = np.sort(scheduled - summary.start_ns) / 1e9
    np.testing.assert_allclose(offsets, sorted(p.offset_s for p in expected), atol=1e-6)
    assert sorted(server.server.received_ids) == sorted(table.column("request_id").to_pylist())
    # Version-2 keys, written at planning time: the pairing index, the unit's clock and the shape's rate.
    by_index = {p.index: p for p in expected}
    rows = table.select(["request_index", "repeat", "unit_start_ns", "offset_s", "offered_rate_rps"]).to_pylist()
    assert sorted(r["request_index"] for r in rows) == sorted(by_index)
    assert all(r["offset_s"] == by_index[r["request_index"]].offset_s for r in rows)
    assert {(r["repeat"], r["unit_start_ns"], r["offered_rate_rps"]) for r in rows} == {(0, summary.start_ns, 30.0)}
    # The worker facts: the priority it ran at and the share of a core it used
    assert summary.niceness is not None and summary.niceness <= max(summary.niceness_at_start or 0, 0)
    assert summary.cpu_share is not None and 0 < summary.cpu_share < 1.5


def test_a_niced_worker_raises_itself_to_normal_where_it_may() -> None:
    import resource
    import subprocess
    import sys

    code = "from loadshapes.worker.state import raise_priority_to_normal as r; print(*r())"
    out = subprocess.run(
        ["nice", "-n", "15", sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    before, after = int(out[0]), int(out[1])
    # Root (CAP_SYS_NICE) may go back to 0; others down to 20 - RLIMIT_NICE at best, else they stay where they were
    lowest = 0 if os.geteuid() == 0 else max(0, 20 - resource.getrlimit(resource.RLIMIT_NICE)[0])
    assert before == 15 and after == (0 if lowest == 0 else 15)


def test_no_coordinated_omission_when_the_server_stalls(server: ServerThread, tmp_path: Path) -> None:
    # 40 req/s for 3 s; the server holds everything that arrives in [1.0 s, 2.0 s) until 2.0 s. The raw client sends
    # the same schedule to the same server at the same time: the host's lateness for a minimal client, then.
    plan = _plan(server.url, tmp_path / "traces", shape=Quiet(rate=40, duration_s=3), process="constant")
    process = LocustProcess(plan, str(tmp_path / "w"))
    process.start()
    try:
        process.wait_ready(60)
        start = now_ns() + 2_000_000_000  # the raw client's process starts in the lead
        raw = raw_client.start(server.url + "/v1/completions", start, [p.offset_s for p in open_loop_schedule(plan)])
        stall_from = (start + 1_000_000_000) / 1e9
        process.go(start)
        time.sleep(max(0.0, stall_from - time.time()))  # switch the stall on at 1.0 s
        _configure(server, stall_until=(start + 2_000_000_000) / 1e9)
        summary = process.wait(60)
        raw_late = raw_client.lateness(raw)
    finally:
        process.stop()
    table = read_traces(str(tmp_path / "traces"))
    assert table.num_rows == summary.scheduled == len(raw_late) >= 119  # 40 req/s, constant gaps, for 3 s
    offset = (np.array(table.column("scheduled_ns").to_pylist()) - start) / 1e9
    e2e = np.array(table.column("e2e_s").to_pylist())
    lateness = np.array(table.column("send_lateness_ns").to_pylist()) / 1e9
    during = (offset > 1.05) & (offset < 1.95)
    assert during.sum() >= 30
    raw_offsets = np.array([p.offset_s for p in open_loop_schedule(plan)])
    raw_during = raw_late[(raw_offsets > 1.05) & (raw_offsets < 1.95)]
    # Sent on schedule although nothing came back during the stall: as late as the raw client was then, within
    # LATE_RATIO (a worker that waited for answers would be up to the stall's 1 s late) ...
    assert np.percentile(lateness[during], 90) <= late_bound(np.percentile(raw_during, 90))
    # ... so each carries the rest of the stall in its latency, counted from its scheduled time.
    np.testing.assert_array_less(2.0 - offset[during] - 0.05, e2e[during])
    assert np.median(e2e[offset < 0.9]) < 0.1 and np.median(e2e[offset > 2.1]) < 0.1


@pytest.mark.parametrize(
    ("fault", "status", "error_class"),
    [
        ("http_500", "error", "http_500"),
        ("truncated", "error", "truncated_stream"),
        ("invalid_json", "error", "invalid_json"),
        ("no_usage", "error", "missing_usage"),
        ("hang", "timeout", "timeout"),
        ("reset", "error", "connection_error"),
        ("http_429", "error", "http_429"),
    ],
)
def test_faults_become_classified_rows(
    server: ServerThread, tmp_path: Path, fault: str, status: str, error_class: str
) -> None:
    _configure(server, fault=fault)
    plan = _plan(server.url, tmp_path / "traces", shape=Quiet(rate=10, duration_s=1), request_timeout_s=1.0)
    summary = _run(plan, tmp_path / "w")
    table = read_traces(str(tmp_path / "traces"))
    assert table.num_rows == summary.scheduled > 0
    assert set(table.column("status").to_pylist()) == {status}
    assert set(table.column("error_class").to_pylist()) == {error_class}
    assert pc.all(pc.is_valid(table.column("error_message"))).as_py()


def test_unfinished_requests_are_cancelled_rows_at_the_drain_limit(server: ServerThread, tmp_path: Path) -> None:
    _configure(server, fault="hang")
    plan = _plan(server.url, tmp_path / "traces", shape=Quiet(rate=10, duration_s=1), drain_s=0.5)
    summary = _run(plan, tmp_path / "w")
    table = read_traces(str(tmp_path / "traces"))
    assert table.num_rows == summary.scheduled > 0
    assert set(table.column("status").to_pylist()) == {"cancelled"}
    assert set(table.column("error_class").to_pylist()) == {"drain_timeout"}


def test_a_worker_held_back_by_its_connection_cap_says_it_is_saturated(server: ServerThread, tmp_path: Path) -> None:
    # Lateness counts from the dispatch (the worker's own timing); the cap's waits come after it.
    _configure(server, chunks=2, chunk_delay_s=0.2)
    plan = _plan(server.url, tmp_path / "traces", shape=Quiet(rate=20, duration_s=1), max_in_flight=1)
    summary, raw_late = _run_beside_the_raw_client(plan, tmp_path / "w", server.url)
    table = read_traces(str(tmp_path / "traces"))
    assert summary.saturated and summary.waited_at_connection_cap > 0 and summary.connections_opened == 1
    sent = table.column("sent_ns").to_numpy(zero_copy_only=False)
    scheduled = table.column("scheduled_ns").to_numpy()
    lateness = table.column("send_lateness_ns").to_numpy(zero_copy_only=False) / 1e9
    # The waits behind one connection of 0.4 s requests grow to seconds; the lateness stays the raw client's.
    assert (sent - scheduled).max() > 0.2e9 and summary.connection_wait_p99_s > 0.2
    assert summary.lateness_p99_s <= late_bound(np.percentile(raw_late, 99)) < summary.connection_wait_p99_s
    assert lateness.max() <= late_bound(raw_late.max())


def test_closed_loop_users_send_back_to_back(server: ServerThread, tmp_path: Path) -> None:
    _configure(server, chunks=2, chunk_delay_s=0.05)
    plan = _plan(server.url, tmp_path / "traces", shape=Concurrency(users=3, duration_s=1.5))
    summary = _run(plan, tmp_path / "w")
    table = read_traces(str(tmp_path / "traces"))
    assert table.num_rows == summary.sent and 3 * 1.5 / 0.05 * 0.5 < table.num_rows < 3 * 1.5 / 0.05 * 1.3
    assert summary.max_in_flight <= 3
    assert len(set(table.column("request_id").to_pylist())) == table.num_rows


def test_api_key_reaches_the_server_and_nothing_else(server: ServerThread, tmp_path: Path) -> None:
    secret = "sk-specdrill-test-" + "7" * 24
    plan = _plan(server.url, tmp_path / "traces", shape=Quiet(rate=10, duration_s=1))
    plan = plan.model_copy(update={"target": plan.target.model_copy(update={"api_key_env": "SPECDRILL_TEST_KEY"})})
    process = LocustProcess(plan, str(tmp_path / "w"))
    process.start(env={"SPECDRILL_TEST_KEY": secret})
    try:
        process.wait_ready(60)
        process.go(now_ns() + 300_000_000)
        summary = process.wait(60)
    finally:
        process.stop()
    assert summary.statuses == {"ok": summary.scheduled} and summary.scheduled > 0
    assert set(server.server.authorization) == {f"Bearer {secret}"}
    for path in [*tmp_path.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path  # plan, log, summary, traces


def test_missing_api_key_stops_the_worker_with_one_line(server: ServerThread, tmp_path: Path) -> None:
    plan = _plan(server.url, tmp_path / "traces", shape=Quiet(rate=10, duration_s=1))
    plan = plan.model_copy(update={"target": plan.target.model_copy(update={"api_key_env": "SPECDRILL_NO_SUCH_KEY"})})
    process = LocustProcess(plan, str(tmp_path / "w"))
    process.start()
    with pytest.raises(RuntimeError, match="SPECDRILL_NO_SUCH_KEY is not set"):
        process.wait_ready(60)


def test_an_unresolvable_target_stops_the_worker_with_one_line(tmp_path: Path) -> None:
    plan = _plan("http://no-such-host.invalid:8000", tmp_path / "traces", shape=Quiet(rate=10, duration_s=1))
    process = LocustProcess(plan, str(tmp_path / "w"))
    process.start()
    with pytest.raises(RuntimeError, match=r"target\.base_url: cannot resolve no-such-host\.invalid"):
        process.wait_ready(60)
