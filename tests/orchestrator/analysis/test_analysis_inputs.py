"""The analysis inputs: bands, run clocks, offered rates, SLOs, reading a run's files. Also the hand-built
trace tables the other analysis tests use."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from loadshapes.shapes import Ramp, Sustained
from loadshapes.slo import Deadlines, SloConfig
from loadshapes.trace import STEP_LIST_COLUMNS, TRACE_SCHEMA, TraceWriter, step_summaries
from orchestrator.analysis.opmap.bands import auto_rate_bands, batch_bands, rate_bands
from orchestrator.analysis.opmap.slo import met_sql
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import CLOCK_SQL, Requests, request_frame
from orchestrator.analysis.read.views import run_requests
from serve_apps.policies import DynamicPolicy, Topology

START_NS = 1_800_000_000 * 10**9


def trace_table(**columns: Sequence[Any] | np.ndarray) -> pa.Table:
    """A trace table from the columns given (the rest null); ids default to {arm}:{shape}:0:{i} per arm."""
    n = len(next(iter(columns.values())))
    data: dict[str, Any] = {"campaign": ["c"] * n, "run": ["r1"] * n, "shape": ["s"] * n, "status": ["ok"] * n}
    data.update({k: list(v) if isinstance(v, np.ndarray) else v for k, v in columns.items()})
    if "request_id" not in data:
        seen: dict[str, int] = {}
        ids = []
        for arm, shape in zip(data["arm"], data["shape"], strict=True):
            ids.append(f"{arm}:{shape}:0:{seen.get(arm, 0)}")
            seen[arm] = seen.get(arm, 0) + 1
        data["request_id"] = ids
    # The version-2 keys and summaries as the load worker writes them: keys from the id, summaries from the lists.
    keys = [rid.rsplit(":", 2)[-2:] if rid and rid.count(":") >= 3 else ["0", "-1"] for rid in data["request_id"]]
    data.setdefault("repeat", [int(r) if r.lstrip("-").isdigit() else 0 for r, _ in keys])
    data.setdefault("request_index", [int(i) if i.lstrip("-").isdigit() else -1 for _, i in keys])
    lists = [data.get(name, [None] * n) for name in STEP_LIST_COLUMNS]
    summaries = [step_summaries(*(lst[i] for lst in lists)) for i in range(n)]
    for name in summaries[0] if n else ():
        data.setdefault(name, [summary[name] for summary in summaries])
    arrays = [pa.array(data[f.name], type=f.type) if f.name in data else pa.nulls(n, f.type) for f in TRACE_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=TRACE_SCHEMA)


def _column(requests: Requests, expression: str, order: str = "offset_s") -> list[Any]:
    return [r[0] for r in requests.con.execute(f"SELECT {expression} FROM requests ORDER BY {order}").fetchall()]


def test_batch_bands_are_inclusive_ranges() -> None:
    bands = batch_bands()
    assert [b.label for b in bands.bands] == ["1-8", "9-32", "33-64", "65-128", "129-256", "257-512"]
    values = np.array([0, 1, 8, 8.5, 9, 64, 64.9, 65, 512, 513, np.nan])
    assert bands.assign(values).tolist() == [-1, 0, 0, 0, 1, 2, 2, 3, 5, -1, -1]
    custom = batch_bands([(1, 4), (10, 20)])
    assert custom.assign(np.array([4.0, 5.0, 10.0])).tolist() == [0, -1, 1]


def test_bands_in_sql_place_values_as_numpy_does() -> None:
    import duckdb

    values = [0, 1, 8, 8.5, 9, 64, 64.9, 65, 512, 513, math.nan, None, 1e12]
    for bands in (batch_bands(), batch_bands([(1, 4), (10, 20)]), rate_bands([0, 10, 20, math.inf])):
        rows = duckdb.sql(
            f"SELECT {bands.sql('v')} FROM (SELECT unnest(?::DOUBLE[]) AS v, unnest(range(?)) AS i) ORDER BY i",
            params=[values, len(values)],
        ).fetchall()
        expected = bands.assign(np.array([math.nan if v is None else v for v in values], dtype=np.float64))
        assert [r[0] for r in rows] == expected.tolist()


def test_rate_bands_and_automatic_edges() -> None:
    bands = rate_bands([0, 10, 20, math.inf])
    assert [b.label for b in bands.bands] == ["0-10", "10-20", "20+"]
    assert bands.assign(np.array([0.0, 9.99, 10.0, 1e9])).tolist() == [0, 0, 1, 2]
    rates = np.random.default_rng(0).uniform(1.0, 100.0, 10_000)
    auto = auto_rate_bands(rates, count=4)
    edges = [b.low for b in auto.bands]
    assert edges[0] == 0 and auto.bands[-1].high is None
    # The request quartiles of U(1, 100) (25.75, 50.5, 75.25, rounded down) stay edges; requests uniform in rate
    # spend time as 1/r, so its time quartiles are 100^(1/4) and 100^(1/2) (and 100^(3/4) = 31.6, within 1.25x
    # of 25: merged), which the edges get too (read from percentiles: within 5%)
    assert {25.0, 50.0, 75.0} <= set(edges) and len(edges) == 6
    assert edges[1] == pytest.approx(100**0.25, rel=0.05) and edges[2] == pytest.approx(10, rel=0.05)
    with pytest.raises(ValueError, match="edges must increase: 10 then 5"):
        rate_bands([0, 10, 5])


def test_offered_rate_from_the_shape_at_each_scheduled_time() -> None:
    ramp = Ramp(rate_from=0, rate_to=100, duration_s=100)
    offsets = np.array([0.0, 10.0, 50.0, 99.0])
    table = trace_table(arm=["a"] * 4, shape=["ramp"] * 4, scheduled_ns=START_NS + (offsets * 1e9).astype(np.int64))
    assert _column(request_frame(table, shapes={"ramp": ramp}), "offered_rate") == pytest.approx([0, 10, 50, 99])
    # The run started 5 s before the first request: the caller knows, the trace does not.
    starts = {("a", "ramp", "r1", 0): START_NS - 5 * 10**9}
    late = request_frame(table, shapes={"ramp": ramp}, run_starts=starts)
    assert _column(late, "offered_rate") == pytest.approx([5.0, 15.0, 55.0, 0.0])  # 104 s is past the ramp's end
    assert set(_column(request_frame(table, shapes={}), "offered_rate")) == {None}
    # A version-2 trace says when its unit started and what rate it offered: no shape needed.
    planned = trace_table(
        arm=["a"] * 4, shape=["ramp"] * 4, scheduled_ns=START_NS + (offsets * 1e9).astype(np.int64),
        unit_start_ns=[START_NS - 10**9] * 4, offered_rate_rps=[1.0, 11.0, 51.0, 100.0],
    )  # fmt: skip
    from_trace = request_frame(planned)
    assert _column(from_trace, "offered_rate") == [1.0, 11.0, 51.0, 100.0]
    assert _column(from_trace, "offset_s") == pytest.approx([1.0, 11.0, 51.0, 100.0])


def test_each_request_stands_for_one_over_the_offered_rate_seconds() -> None:
    steady = Sustained(rate=4, duration_s=50)
    offsets = np.arange(200) / 4.0
    table = trace_table(arm=["a"] * 200, shape=["s"] * 200, scheduled_ns=START_NS + (offsets * 1e9).astype(np.int64))
    clock = _column(request_frame(table, shapes={"s": steady}), CLOCK_SQL)
    assert sum(clock) == pytest.approx(50.0)
    unknown = _column(request_frame(table), CLOCK_SQL)  # no shape: the run's own mean arrival rate stands in
    assert unknown == pytest.approx([0.25] * 200)  # 199 gaps over 49.75 s: 4 req/s


def test_slo_deadlines_per_category() -> None:
    slos = SloConfig(ttft_s=1.0, tpot_s=0.05, per_category={"reasoning": Deadlines(ttft_s=3.0, tpot_s=1.0)})
    table = trace_table(
        arm=["a"] * 6,
        scheduled_ns=START_NS + np.arange(6) * 10**9,
        status=["ok", "ok", "ok", "error", "ok", "ok"],
        ttft_s=[0.5, 2.0, 2.0, 0.1, 0.5, np.nan],
        tpot_s=[0.01, 0.01, 0.5, 0.01, np.nan, 0.01],
        e2e_s=[1.0] * 6,
        category=["chat", "chat", "reasoning", "chat", None, "chat"],
    )
    met = _column(request_frame(table), met_sql(slos))
    # chat: ttft 2.0 > 1.0 misses; reasoning: ttft 3 s and tpot 1 s allowed; failed requests never count;
    # a one-token answer (no tpot) cannot miss the tpot deadline; a missing ttft misses a set deadline.
    assert met == [True, False, True, False, True, False]


def test_arm_info_configured_k_table_and_fallback() -> None:
    policy = DynamicPolicy(method="ngram", max_k=3, schedule=((1, 64, 3), (65, 128, 1), (200, 512, 0)))
    arm = ArmInfo.from_policy("dyn", policy, topology=Topology(kind="data_parallel", size=2), max_num_seqs=512)
    table = arm.k_table()
    assert (table[1], table[64], table[65], table[150], table[200], table[512]) == (3, 3, 1, 1, 0, 0)
    assert arm.expects_static_fallback and arm.topology == "data_parallel2" and not arm.baseline
    with pytest.raises(ValueError, match="dynamic arm has max k"):
        ArmInfo(name="x", kind="dynamic", k=3)


def test_a_run_directory_reads_as_the_same_requests_as_its_table(tmp_path: Path) -> None:
    table = trace_table(
        arm=["off", "dyn"] * 6,
        shape=["ramp"] * 6 + ["quiet"] * 6,
        category=["chat", "code", None] * 4,
        status=["ok", "ok", "error"] * 4,
        scheduled_ns=START_NS + np.arange(12) * 10**9,
        ttft_s=np.linspace(0.1, 1.2, 12),
        step_batch_size=[[1, 2], [3], []] * 4,
        step_k=[[3, 3], [1], []] * 4,
    )
    writer = TraceWriter(str(tmp_path / "traces"), writer_id="w", flush_rows=5)
    for row in table.to_pylist():
        writer.append(row)
    writer.close()
    columns = "arm, shape, request_index, ok, ttft, typical_batch, steps, k_sum, offset_s"
    order = "arm, shape, request_index"
    units = [(arm, shape, 0) for arm in ("off", "dyn") for shape in ("ramp", "quiet")]
    from_files = run_requests(str(tmp_path), units)
    assert _column(from_files, f"({columns})", order) == _column(request_frame(table), f"({columns})", order)
    assert len(from_files) == 12
    # Only complete units count: without dyn/quiet its rows are not read.
    assert len(run_requests(str(tmp_path), units[:3])) == 9


def _view_sql(requests: Requests, name: str) -> str:
    row = requests.con.execute("SELECT sql FROM duckdb_views() WHERE view_name = ?", [name]).fetchone()
    return str(row[0]) if row else ""


@pytest.mark.parametrize("mixed_file", [False, True])
def test_run_clocks_from_the_footers_equal_those_from_the_rows(tmp_path: Path, mixed_file: bool) -> None:
    """Two runs and two repeats per unit, a partial unit's rows in the same directories, one writer per unit as
    the load worker writes: the footers decide every run and the views read each run's files with its clock as
    constants. A file holding two repeats (mixed_file) leaves the footers undecided: the rows are joined as
    before. Either way the same runs and requests as the table in memory."""
    rng = np.random.default_rng(3)
    n = 40
    arm = ["off", "dyn"] * (n // 2)
    repeat = [i // 10 % 2 for i in range(n)]  # repeats 0 and 1 interleaved by tens
    run = ["r1" if i < 30 else "r2" for i in range(n)]
    table = trace_table(
        arm=arm,
        shape=["ramp"] * n,
        run=run,
        repeat=repeat,
        request_index=list(range(n)),
        request_id=[f"{a}:ramp:{r}:{i}" for i, (a, r) in enumerate(zip(arm, repeat, strict=True))],
        scheduled_ns=START_NS + np.sort(rng.integers(0, 10**11, n)),
        unit_start_ns=[START_NS - 5 * 10**9] * n,
        ttft_s=rng.uniform(0.1, 1.0, n),
        offered_rate_rps=rng.uniform(1, 9, n),
    )
    writers: dict[tuple[str, int, str], TraceWriter] = {}
    for row in table.to_pylist():
        key = ("all", 0, "") if mixed_file else (row["arm"], row["repeat"], row["run"])
        if key not in writers:
            writers[key] = TraceWriter(str(tmp_path / "traces"), writer_id="-".join(map(str, key)), flush_rows=7)
        writers[key].append(row)
    for writer in writers.values():
        writer.close()
    units = [("off", "ramp", 0), ("off", "ramp", 1), ("dyn", "ramp", 0)]  # dyn repeat 1 is partial: left out
    from_files = run_requests(str(tmp_path), units)
    complete = table.filter(
        pa.compute.invert(pa.compute.and_(pa.compute.equal(table["arm"], "dyn"), pa.compute.equal(table["repeat"], 1)))
    )
    in_memory = request_frame(complete)
    try:
        assert ("JOIN runs" in _view_sql(from_files, "requests")) == mixed_file
        runs = "SELECT arm, shape, run, repeat, rows, first_ns, last_ns, start_ns, span_s, mean_rate FROM runs "
        runs += " ORDER BY ALL"
        assert from_files.con.execute(runs).fetchall() == in_memory.con.execute(runs).fetchall()
        columns = "(arm, shape, run, repeat, run_id, request_index, ttft, offset_s, offered_rate, span_s, mean_rate)"
        order = "arm, repeat, request_index"
        assert _column(from_files, columns, order) == _column(in_memory, columns, order)
        assert len(from_files) == complete.num_rows == 30
        assert from_files.arms == ("dyn", "off")
    finally:
        from_files.close()
        in_memory.close()


def test_offered_rate_bands_spread_evenly_where_the_quantiles_coincide() -> None:
    # A step: 10 requests at 1 req/s, then 6000 at 60: every quantile is 60, which left one band below it
    rates = np.array([1.0] * 10 + [60.0] * 6000)
    stepped = auto_rate_bands(rates, count=5)
    assert [b.label for b in stepped.bands] == ["0-12", "12-24", "24-36", "36-48", "48+"]
    # A 1 -> 60 req/s ramp (requests in proportion to the rate): its request quintiles sqrt(1 + q (60^2 - 1))
    # (26.8, 37.9, 46.5, 53.7) stay the edges; its time quintiles 1 + 59 q (12.8, 24.6, 36.4, 48.2) add 12, the
    # others within 1.25x of one already there
    ramp = np.sqrt(1 + np.linspace(0, 1, 10_000) * (60**2 - 1))
    labels = ["0-12", "12-26", "26-37", "37-46", "46-53", "53+"]
    assert [b.label for b in auto_rate_bands(ramp, count=5).bands] == labels
    # One rate only: nothing to spread
    assert [b.label for b in auto_rate_bands(np.full(100, 20.0)).bands] == ["0-20", "20+"]


def test_a_campaigns_rate_band_edges_are_the_bands(tmp_path: Path) -> None:
    import yaml

    from orchestrator.analysis.read.inputs import load_run
    from orchestrator.analysis.summary import build_summary
    from orchestrator.plan.campaign import CampaignError, load_campaign
    from orchestrator.virtual.campaign import simulate_campaign

    data = {
        "name": "edges", "engine": {"kind": "simulated"}, "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": {"ramp": {"kind": "ramp", "rate_from": 1, "rate_to": 60, "duration_s": 6}},
        "analysis": {"rate_bands": [0, 10, 20, 40, 60]}, "output": str(tmp_path / "run"),
    }  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    store, _ = simulate_campaign(load_campaign(path), output=str(tmp_path / "run"))
    summary, _ = build_summary(load_run(store.root))
    rate_map = next(m for m in summary.maps if m.measure == "offered_rate")
    assert [b.label for b in rate_map.bands] == ["0-10", "10-20", "20-40", "40-60", "60+"]
    path.write_text(yaml.safe_dump({**data, "analysis": {"rate_bands": [0, 20, 10]}}))
    with pytest.raises(CampaignError, match=r"analysis\.rate_bands: .*rate band edges must increase: 20 then 10"):
        load_campaign(path)
