from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadshapes.trace import (
    COLUMNS,
    FILE_SCHEMA,
    SCHEMA_VERSION,
    TRACE_SCHEMA,
    TraceVersionError,
    TraceWriter,
    read_traces,
    rows_to_table,
    rows_to_table_in_steps,
    schema_version,
    step_summaries,
    to_ns,
)
from tests import REPO


def row(i: int, *, arm: str = "dyn-single", shape: str = "ramp", status: str = "ok") -> dict[str, Any]:
    return {
        "campaign": "c", "run": "r1", "arm": arm, "policy": "dynamic", "topology": "single", "shape": shape,
        "phase": "ramp", "worker": i % 3, "request_id": f"req-{i}", "repeat": 0, "request_index": i,
        "category": "chat",
        "scheduled_ns": to_ns(1_800_000_000 + i), "sent_ns": to_ns(1_800_000_000 + i + 0.001),
        "first_token_ns": to_ns(1_800_000_000 + i + 0.05) if status == "ok" else None,
        "done_ns": to_ns(1_800_000_000 + i + 0.5), "send_lateness_ns": 1_000_000,
        "prompt_tokens": 12, "output_tokens": 32 if status == "ok" else 0, "ttft_s": 0.05, "e2e_s": 0.5,
        "token_times_ns": [to_ns(1_800_000_000 + i + 0.05 + j * 0.01) for j in range(4)],
        "step_k": [3, 3, 1, 0], "step_batch_size": [1, 2, 5, 70], "per_step_drafted": [3, 3, 1],
        "per_step_accepted": [2, 1, 0], "resolved_speculative_config": '{"method": "eagle"}',
        "schedule_dropped": False, "status": status,
        "error_class": None if status == "ok" else "ReadTimeout", "error_message": None if status == "ok" else "x",
    }  # fmt: skip


def test_round_trip_with_hive_partitions(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path / "traces"), writer_id="w0", flush_rows=7, flush_s=3600)
    rows = [row(i, arm="dyn-single" if i % 2 else "off-single", shape="ramp" if i < 10 else "quiet") for i in range(25)]
    rows.append(row(99, status="error"))
    for r in rows:
        writer.append(r)
    writer.close()
    assert writer.rows_written == len(rows)
    table = read_traces(str(tmp_path / "traces"))
    assert table.num_rows == len(rows)  # rows == requests scheduled, errors included
    assert set(table.column_names) == set(COLUMNS)
    by_id = {r["request_id"]: r for r in table.to_pylist()}
    original = rows[3]
    assert {k: by_id["req-3"][k] for k in original} == original
    assert by_id["req-99"]["status"] == "error" and by_id["req-99"]["first_token_ns"] is None
    parts = sorted(p.relative_to(tmp_path / "traces").parts[:2] for p in (tmp_path / "traces").rglob("*.parquet"))
    assert ("arm=dyn-single", "shape=ramp") in parts and ("arm=off-single", "shape=quiet") in parts
    assert not list((tmp_path / "traces").rglob(".tmp-*"))  # atomic: no temporary files left
    one = next((tmp_path / "traces").rglob("*.parquet"))
    assert schema_version(str(one)) == SCHEMA_VERSION
    assert "arm" not in pq.read_schema(one).names  # partition values live in the path
    assert read_traces(str(tmp_path / "traces")).schema.metadata == TRACE_SCHEMA.metadata


def test_flushes_by_rows_and_by_time(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path), writer_id="w1", flush_rows=5, flush_s=3600)
    for i in range(12):
        writer.append(row(i))
    assert writer.rows_written == 10
    writer.close()
    assert writer.rows_written == 12
    timed = TraceWriter(str(tmp_path / "t"), writer_id="w2", flush_rows=10**6, flush_s=0.0)
    timed.append(row(1))
    assert timed.rows_written == 1


def test_rows_convert_in_small_steps_to_the_same_table() -> None:
    rows = [
        {**row(i), "step_k": [3, 1, 0][: i % 4], "token_times_ns": list(range(i)), "error_message": None}
        for i in range(300)
    ]
    steps = rows_to_table_in_steps(rows)
    kinds = []
    while True:
        try:
            kinds.append(next(steps))
        except StopIteration as done:
            table = done.value
            break
    # A slice per 256 rows of a scalar column, per 32 rows of a list column, then one assembly step.
    lists = sum(pa.types.is_list(f.type) for f in FILE_SCHEMA)
    assert kinds == ["slice"] * (2 * (len(FILE_SCHEMA) - lists) + 10 * lists) + ["assemble"]
    names = FILE_SCHEMA.names
    assert table.equals(pa.Table.from_pylist([{n: r.get(n) for n in names} for r in rows], schema=FILE_SCHEMA))
    assert rows_to_table(rows).equals(table)


def test_unknown_columns_are_refused(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path), writer_id="w")
    with pytest.raises(ValueError, match="columns the schema does not: latency_ms"):
        writer.append({**row(1), "latency_ms": 3})


def test_concurrent_appends_lose_nothing(tmp_path: Path) -> None:
    writer = TraceWriter(str(tmp_path), writer_id="w", flush_rows=13, flush_s=3600)

    def work(offset: int) -> None:
        for i in range(200):
            writer.append(row(offset + i))

    threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    table = read_traces(str(tmp_path))
    assert table.num_rows == 800 and len(set(table.column("request_id").to_pylist())) == 800


def test_a_writer_killed_mid_write_leaves_no_file_readers_see(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    root = tmp_path / "traces"
    writer = TraceWriter(str(root), writer_id="before")
    for i in range(50):
        writer.append(row(i))
    writer.close()
    # A child writes part files in a loop; SIGKILL lands somewhere inside a write.
    script = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.loadshapes.test_trace import row
from loadshapes.trace import PartWriter
w = PartWriter({str(root)!r}, writer_id="killed")
print("go", flush=True)
while True:
    w.write([row(i) for i in range(20000)])
"""
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "go"
    time.sleep(1.5)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    table = read_traces(str(root))  # no half-written file is visible: only complete parts are read
    assert table.num_rows % 20000 == 50
    assert all(not p.name.startswith("part-") or p.stat().st_size > 0 for p in root.rglob("*.parquet"))


def test_step_summaries_of_one_request() -> None:
    summary = step_summaries([1, 2, 5, 70], [3, 3, 1, 0], [3, 0, 1], [2, 0, 0])
    assert summary == {
        "engine_steps": 4, "step_batch_mean": 19.5, "step_batch_max": 70, "step_k_sum": 7, "spec_steps": 2,
        "drafted_tokens": 4, "accepted_tokens": 2,
    }  # fmt: skip
    # No speculation reported (vLLM sends null): no drafts; no telemetry at all: nothing to summarise.
    assert step_summaries([4], [0], None, None)["drafted_tokens"] == 0
    assert set(step_summaries(None, None, None, None).values()) == {None}


def test_a_version_1_trace_is_refused_in_one_line(tmp_path: Path) -> None:
    old_schema = pa.schema(
        [f for f in FILE_SCHEMA if f.name not in ("repeat", "request_index")],
        metadata={b"specdrill.trace_schema_version": b"1"},
    )
    table = pa.Table.from_pylist([{k: v for k, v in row(1).items() if k in old_schema.names}], schema=old_schema)
    (tmp_path / "arm=a" / "shape=s").mkdir(parents=True)
    pq.write_table(table, tmp_path / "arm=a" / "shape=s" / "part-0.parquet")
    with pytest.raises(TraceVersionError, match="trace schema version 1, this specdrill reads version 2") as caught:
        read_traces(str(tmp_path))
    assert "\n" not in str(caught.value)
