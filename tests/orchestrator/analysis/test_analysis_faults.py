"""Fault windows on a synthetic trace with known answers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.analysis.read.faults import fault_windows, fault_windows_of, outcome_ns, outcomes_by_unit, unit_keys
from orchestrator.analysis.read.source import request_frame

START = 1_800_000_000 * 10**9


def _rows(arm: str, shape: str, repeat: int, outcomes: list[tuple[float, str, str | None]]) -> pa.Table:
    n = len(outcomes)
    return pa.table(
        {
            "arm": pa.array([arm] * n).dictionary_encode(),
            "shape": pa.array([shape] * n).dictionary_encode(),
            "request_id": [f"{arm}:{shape}:{repeat}:{i}" for i in range(n)],
            "scheduled_ns": pa.array([START + round((t - 0.5) * 1e9) for t, _, _ in outcomes], pa.int64()),
            # a request that never got an answer has no done time: its scheduled time stands in
            "done_ns": pa.array([None if s == "not_sent" else START + round(t * 1e9) for t, s, _ in outcomes]),
            "status": [s if s != "not_sent" else "cancelled" for _, s, _ in outcomes],
            "error_class": [c for _, _, c in outcomes],
        }
    )


def test_failures_close_in_time_make_one_window_and_count_what_else_ended_there() -> None:
    outcomes: list[tuple[float, str, str | None]] = [(t, "ok", None) for t in np.arange(0.25, 30, 0.5)]
    outcomes += [(10.0, "error", "truncated_stream")] * 4 + [(11.5, "error", "http_503")] * 2  # one outage
    outcomes += [(25.0, "timeout", "timeout")]  # a second, 13.5 s later
    table = _rows("off-single", "steady", 0, outcomes)
    failed = table.filter(pc.not_equal(table["status"], "ok"))
    keys, times = unit_keys(table), outcome_ns(table)
    assert set(keys) == {"off-single/steady/r0"}
    windows = fault_windows(failed, {"off-single/steady/r0": np.sort(times)}, {"off-single/steady/r0": START})
    assert [(w.start_s, w.end_s, w.failed) for w in windows] == [(10.0, 11.5, 6), (25.0, 25.0, 1)]
    first, second = windows
    assert first.by_class == {"truncated_stream": 4, "http_503": 2}
    assert first.ended == 6 + 3  # the ok requests that ended at 10.25, 10.75, 11.25 inside [10, 11.5]
    assert second.ended == 1 and second.by_class == {"timeout": 1}
    assert first.message.startswith("off-single/steady/r0: 6 of 9 requests failed between 10.0 s and 11.5 s")


def test_windows_are_per_unit_and_a_request_never_sent_counts_at_its_scheduled_time() -> None:
    a = _rows("fixed3-single", "cross", 1, [(1.0, "ok", None), (5.0, "not_sent", "not_sent")])
    b = _rows("off-single", "cross", 1, [(2.0, "error", "connection_error")])
    both = pa.concat_tables([a, b], promote_options="permissive")
    failed = both.filter(pc.not_equal(both["status"], "ok"))
    ended = outcomes_by_unit(both)
    assert sorted(ended) == ["fixed3-single/cross/r1", "off-single/cross/r1"]
    assert ended["fixed3-single/cross/r1"].tolist() == [START + 10**9, START + 45 * 10**8]  # not_sent: scheduled
    assert ended["off-single/cross/r1"].tolist() == [START + 2 * 10**9]
    windows = fault_windows(failed, {}, {"fixed3-single/cross/r1": START, "off-single/cross/r1": START})
    assert [(w.unit, w.start_s, w.failed) for w in windows] == [
        ("fixed3-single/cross/r1", 4.5, 1),
        ("off-single/cross/r1", 2.0, 1),
    ]
    assert fault_windows(failed.slice(0, 0), {}, {}) == []


def test_a_runs_views_give_the_same_windows_as_its_table() -> None:
    outcomes: list[tuple[float, str, str | None]] = [(t, "ok", None) for t in np.arange(0.25, 30, 0.5)]
    outcomes += [(10.0, "error", "truncated_stream")] * 4 + [(11.5, "error", "http_503")] * 2
    outcomes += [(25.0, "not_sent", "not_sent")]
    one = _rows("off-single", "steady", 2, outcomes)
    other = _rows("dyn-single", "steady", 2, [(3.0, "ok", None), (4.0, "error", "http_500")])
    table = pa.concat_tables([one, other], promote_options="permissive")
    starts = {"off-single/steady/r2": START, "dyn-single/steady/r2": START - 10**9}
    expected = fault_windows(table.filter(pc.not_equal(table["status"], "ok")), outcomes_by_unit(table), starts)
    plain = table.cast(pa.schema([pa.field(f.name, pa.string()) if f.name in ("arm", "shape") else f
                                  for f in table.schema]))  # fmt: skip
    requests = request_frame(plain.append_column("repeat", pa.array([2] * table.num_rows, pa.int32())))
    assert fault_windows_of(requests, starts) == expected and len(expected) == 3


def test_a_drain_timeout_is_named_as_such() -> None:
    from orchestrator.analysis.read.faults import FaultWindow

    at = FaultWindow(unit="a/s/r0", start_s=224.2, end_s=224.2, failed=3, ended=5, by_class={"drain_timeout": 3})
    assert at.message == "a/s/r0: drain timeout at 224.2 s: 3 of 5 requests still in flight cancelled"
    mixed = at.model_copy(update={"by_class": {"drain_timeout": 2, "server_error": 1}, "end_s": 230.0})
    assert "failed between 224.2 s and 230.0 s" in mixed.message
