"""`specdrill report` on DuckDB against DuckDB's own plain aggregates, at 1 and 10 million trace rows.

Generates a synthetic run directory (manifest, unit markers, version-2 traces, engine step timelines) with
realistic step counts: output tokens lognormal around 200, steps = output tokens for `off` and output tokens /
(1 + accepted per step) for the speculative arms; 4 arms (off, fixed k=3, dynamic on one engine, dynamic on a
data-parallel group that fell back to the static k), 3 shapes with the same paired schedule in every arm; one
part file per unit with row groups of 100,000 rows, as a run leaves a unit once it merges the unit's part
files (orchestrator.rundir.unit_files.merge_parts). Then,
each stage in its own process (so each peak RSS is its own; times exclude the stage's imports), best of
--repeats:

  plain_maps    DuckDB: one scan, GROUPING SETS (arm, batch band) and (arm, rate band): count, TTFT/TPOT quantiles
  plain_map_inputs  DuckDB: the maps' own inputs in one scan: 13 columns, sums and 4 measures' quantiles per
                (arm, band, category) of both band sets (what the maps cannot do with less; no pairing)
  maps          ours: both operating maps (per-request view, pairing join, bootstrap, verdicts, crossovers)
  plain_steps   DuckDB: histogram of (arm, step batch size, step k) over the timelines
  verify        ours: the executed-policy verification from the timelines (every check, switch timing)
  report        ours: the whole `specdrill report` (maps, verification, fault windows, summary.json, report.html)

Targets: maps <= 2x plain_maps; verify <= 1.5x plain_steps; report peak RSS <= 2 GiB at 10M rows and at most
25% above its 1M-row figure; on 4x the rows (100k -> 400k: 25k -> 100k requests per arm) within 1.25x.
Also the trace's bytes per request with the per-step lists and without (default).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadshapes.arrivals import shape_arrivals
from loadshapes.shapes import CrossAndRecover, Ramp, Sustained
from loadshapes.trace import FILE_SCHEMA
from orchestrator.plan.campaign import Campaign
from orchestrator.rundir.layout import RunStore, Unit, UnitResult
from orchestrator.rundir.unit_files import MERGED_WORKER

MAX_NUM_SEQS = 512
CATEGORIES = ("reasoning", "chat", "editing")
ACCEPT_P = np.array([0.62, 0.5, 0.8])
ROWS_PER_FILE = 1000  # the load worker's default flush: one part file per 1000 rows
SCHEDULE = "dynamic:3:1-64=3,65-128=1,129-512=0"
RSS_RATIO_TARGET = 1.25  # the report's peak RSS on 4x the rows (25k -> 100k requests per arm by default)
START_NS = 1_800_000_000 * 10**9


def bench_shapes(rows_per_arm: int) -> dict[str, Ramp | CrossAndRecover | Sustained]:
    per_shape = rows_per_arm / 3
    # Unit shapes (expected requests known), stretched in time to the row count wanted.
    ramp = Ramp(rate_from=2, rate_to=120, duration_s=1.0)
    # boundary_rate: where the generated batch (rate x 2.6 x 0.88) passes the schedule's 64.
    cross = CrossAndRecover(
        quiet_rate=5, peak_rate=100, boundary_rate=28, quiet_s=0.2, rise_s=0.15, hold_s=0.3, fall_s=0.15
    )
    sustained = Sustained(rate=60, duration_s=1.0)
    return {
        "ramp": ramp.model_copy(update={"duration_s": per_shape / ramp.expected_requests}),
        "cross": cross.model_copy(
            update={
                k: getattr(cross, k) * per_shape / cross.expected_requests
                for k in ("quiet_s", "rise_s", "hold_s", "fall_s")
            }
        ),
        "sustained": sustained.model_copy(update={"duration_s": per_shape / sustained.expected_requests}),
    }


def bench_campaign(rows: int, output: Path) -> Campaign:
    shapes = bench_shapes(rows // 4)
    return Campaign.model_validate(
        {
            "name": "bench",
            "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
            "policies": {"off": "off", "fixed3": "fixed:3", "dyn": SCHEDULE},
            "topologies": {"single": "single", "dp2": "data_parallel:2"},
            "arms": [
                {"policy": "off", "topology": "single"},
                {"policy": "fixed3", "topology": "single"},
                {"policy": "dyn", "topology": "single"},
                {"policy": "dyn", "topology": "dp2"},
            ],
            "shapes": {name: shape.model_dump() for name, shape in shapes.items()},
            "mix": {"entries": [{"workload": "chat", "weight": 1}]},
            "output": str(output),
        }
    )


def _executed_k_table(arm: Any) -> np.ndarray:
    """The k the engine ran per batch size: under data parallelism vLLM dropped the schedule for the static k."""
    resolved = arm.policy.resolve(arm.topology)
    return np.asarray(resolved.k_table(MAX_NUM_SEQS), dtype=np.int64)


def _resolved_config(arm: Any) -> str | None:
    resolved = arm.policy.resolve(arm.topology)
    if resolved.num_speculative_tokens == 0:
        return None
    schedule = resolved.schedule
    return json.dumps(
        {
            "method": "eagle",
            "num_speculative_tokens": resolved.num_speculative_tokens,
            "num_speculative_tokens_per_batch_size": [list(e) for e in schedule] if schedule else None,
        },
        sort_keys=True,
    )


def _lists(lengths: np.ndarray, values: np.ndarray, kind: pa.DataType) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, kind.value_type), type=kind)


def partition(
    arm: Any, arm_index: int, shape_name: str, shape: Any, offsets_s: np.ndarray, start_ns: int, seed: int,
    *, step_lists: bool = False,
) -> pa.Table:  # fmt: skip
    """One (arm, shape) unit's trace rows (FILE_SCHEMA)."""
    n = len(offsets_s)
    rng = np.random.default_rng([seed, arm_index, zlib.crc32(shape_name.encode())])
    shared = np.random.default_rng([seed, zlib.crc32(shape_name.encode())])  # traits common to every arm
    rate = shape.rate_at(offsets_s)
    peak = float(rate.max())
    difficulty = shared.lognormal(0.0, 0.25, n)
    category = shared.integers(0, len(CATEGORIES), n)
    output_tokens = np.clip(shared.lognormal(np.log(200), 0.5, n), 2, 2048).astype(np.int64)
    prompt_tokens = np.clip(shared.lognormal(np.log(600), 0.6, n), 8, 8000).astype(np.int32)

    table_k = _executed_k_table(arm)
    speculative = int(table_k.max()) > 0
    batch_mean = np.clip(rate * 2.6 * (0.88 if speculative else 1.0) * rng.lognormal(0, 0.1, n), 1, MAX_NUM_SEQS)
    k = table_k[np.rint(batch_mean).astype(np.int64)]
    accepted_per_step = k * ACCEPT_P[category] * rng.uniform(0.8, 1.0, n)
    steps = np.maximum(1, np.ceil(output_tokens / (1.0 + accepted_per_step))).astype(np.int64)
    spec_steps = np.where(k > 0, steps, 0)
    drafted = spec_steps * k
    accepted = np.minimum(drafted, np.maximum(0, output_tokens - steps))
    tpot_off = 0.008 + 0.00006 * batch_mean
    gain = 1.0 + (k / 3.0) * (0.7 * np.exp(-batch_mean / 100.0) - 0.25 * batch_mean / 256)
    idle = np.where(speculative & (k == 0), 0.93, 1.0)  # a loaded drafter costs even at k = 0
    tpot = tpot_off / gain * idle * difficulty * rng.lognormal(0, 0.1, n)
    load = rate / peak
    queue_wait = rng.exponential(0.002 + 0.6 * load**6, n)
    ttft = 0.03 + queue_wait + 0.00004 * prompt_tokens * rng.lognormal(0, 0.1, n)
    e2e = ttft + tpot * (output_tokens - 1)
    ok = rng.random(n) >= 0.001 + 0.03 * load**4

    scheduled = start_ns + np.rint(offsets_s * 1e9).astype(np.int64)
    lateness = rng.integers(50_000, 500_000, n)
    sent = scheduled + lateness
    first_token = scheduled + np.rint(ttft * 1e9).astype(np.int64)
    done = scheduled + np.rint(e2e * 1e9).astype(np.int64)
    received = sent + 300_000
    first_scheduled = received + np.rint(queue_wait * 1e9).astype(np.int64)
    index = np.arange(n)
    request_id = pc.binary_join_element_wise(arm.name, shape_name, "0", pc.cast(pa.array(index), pa.string()), ":")
    config = _resolved_config(arm)

    def when_ok(values: np.ndarray) -> pa.Array:
        return pa.array(values, mask=~ok)

    columns: dict[str, Any] = {
        "campaign": pa.array(np.full(n, "bench")),
        "run": pa.array(np.full(n, "r1")),
        "policy": pa.array(np.full(n, arm.policy.label)),
        "topology": pa.array(np.full(n, arm.topology.label)),
        "phase": pa.array(shape.phase_at(offsets_s)),
        "worker": pa.array((index % 4).astype(np.int32)),
        "request_id": request_id,
        "repeat": pa.array(np.zeros(n, np.int32)),
        "request_index": pa.array(index),
        "category": pa.array(np.array(CATEGORIES)[category]),
        "scheduled_ns": pa.array(scheduled),
        "unit_start_ns": pa.array(np.full(n, start_ns)),
        "offset_s": pa.array(offsets_s),
        "offered_rate_rps": pa.array(rate),
        "sent_ns": pa.array(sent),
        "first_token_ns": when_ok(first_token),
        "done_ns": pa.array(done),
        "send_lateness_ns": pa.array(lateness),
        "prompt_tokens": pa.array(prompt_tokens),
        "output_tokens": pa.array(np.where(ok, output_tokens, 0).astype(np.int32)),
        "ttft_s": when_ok(ttft),
        "e2e_s": when_ok(e2e),
        "tpot_s": when_ok(tpot),
        "itl_p50_s": when_ok(tpot),
        "itl_p99_s": when_ok(tpot * 3),
        "itl_max_s": when_ok(tpot * 5),
        "queue_wait_s": pa.array(queue_wait),
        "server_received_ns": pa.array(received),
        "server_first_scheduled_ns": pa.array(first_scheduled),
        "server_first_token_ns": when_ok(first_token),
        "server_done_ns": pa.array(done),
        "engine_steps": pa.array(steps.astype(np.int32)),
        "step_batch_mean": pa.array(batch_mean),
        "step_batch_max": pa.array(np.minimum(MAX_NUM_SEQS, np.ceil(batch_mean * 1.3)).astype(np.int32)),
        "step_k_sum": pa.array(steps * k),
        "spec_steps": pa.array(spec_steps.astype(np.int32)),
        "drafted_tokens": pa.array(drafted),
        "accepted_tokens": pa.array(accepted),
        "mean_acceptance_length": pa.array(1 + accepted / np.maximum(spec_steps, 1), mask=spec_steps == 0),
        "resolved_speculative_config": pa.array([config] * n, type=pa.string()),
        "schedule_dropped": pa.array(np.full(n, "dp" in arm.topology.label and arm.policy.kind == "dynamic")),
        "engine_id": pa.array(np.char.add(f"{arm.name}-sim-", (index % max(1, arm.topology.size)).astype(str))),
        "status": pa.array(np.where(ok, "ok", "error")),
        "error_class": pa.array(np.full(n, "ReadTimeout"), mask=ok),
    }
    if step_lists:  # what every row carried before version 2: each step of the request, repeated per request
        parent = np.repeat(index, steps)
        batch = np.clip(np.rint(batch_mean[parent] * rng.lognormal(0, 0.15, len(parent))), 1, MAX_NUM_SEQS)
        step_k = table_k[batch.astype(np.int64)]
        columns["step_batch_size"] = _lists(steps, batch.astype(np.int32), pa.list_(pa.int32()))
        columns["step_k"] = _lists(steps, step_k.astype(np.int16), pa.list_(pa.int16()))
        drafting = step_k > 0
        per_request = np.bincount(parent[drafting], minlength=n)
        step_drafted = step_k[drafting]
        columns["per_step_drafted"] = _lists(per_request, step_drafted.astype(np.int16), pa.list_(pa.int16()))
        step_accepted = rng.binomial(step_drafted, ACCEPT_P[category[parent[drafting]]])
        columns["per_step_accepted"] = _lists(per_request, step_accepted.astype(np.int16), pa.list_(pa.int16()))
    arrays = [columns.get(f.name, pa.nulls(n, f.type)) for f in FILE_SCHEMA]
    return pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, FILE_SCHEMA, strict=True)], schema=FILE_SCHEMA)


def timeline(arm: Any, shape: Any, start_ns: int, seed: int) -> pa.Table:
    """The unit's engine steps: one row per step of every engine, back to back over the shape's duration."""
    rng = np.random.default_rng([seed, zlib.crc32(arm.name.encode())])
    table_k = _executed_k_table(arm)
    speculative = int(table_k.max()) > 0
    engines = arm.topology.size if arm.topology.kind != "single" else 1
    parts = []
    for rank in range(engines):
        # Step time grows with the batch; the batch follows the offered rate (split over the engines).
        guess = np.arange(0.0, shape.duration, 0.012)
        batch_at = np.clip(shape.rate_at(guess) * 2.6 * (0.88 if speculative else 1.0) / engines, 1, MAX_NUM_SEQS)
        batch = np.clip(np.rint(batch_at * rng.lognormal(0, 0.15, len(guess))), 1, MAX_NUM_SEQS).astype(np.int64)
        length = 0.008 + 0.00006 * batch * engines
        start = np.concatenate([[0.0], np.cumsum(length)[:-1]])
        keep = start < shape.duration
        batch, length, start = batch[keep], length[keep], start[keep]
        k = table_k[batch]
        drafted = k * batch
        n = len(batch)
        parts.append(
            pa.table(
                {
                    "engine_id": pa.array(np.full(n, f"{arm.name}-sim-{rank}")),
                    "start_ns": pa.array(start_ns + np.rint(start * 1e9).astype(np.int64)),
                    "end_ns": pa.array(start_ns + np.rint((start + length) * 1e9).astype(np.int64)),
                    "dp_rank": pa.array(np.full(n, rank, np.int32)),
                    "batch_size": pa.array(batch.astype(np.int32)),
                    "num_prefill": pa.array(rng.integers(0, 3, n).astype(np.int32)),
                    "k": pa.array(k.astype(np.int32)),
                    "drafted": pa.array(drafted.astype(np.int32)),
                    "accepted": pa.array(rng.binomial(drafted, 0.6).astype(np.int32)),
                    "waiting": pa.array(rng.integers(0, 5, n).astype(np.int32)),
                    # What every simulated run's timeline carries (and vLLM's with iteration details): the report
                    # then fits the step time, its largest hold of memory (the k-switch cost).
                    "batched_tokens": pa.array((batch * (1 + k) + rng.integers(0, 3, n) * 256).astype(np.int32)),
                    "kv_tokens": pa.array((batch * rng.integers(300, 1200, n)).astype(np.int32)),
                }
            )
        )
    return pa.concat_tables(parts)


def generate(run_dir: Path, rows: int, seed: int) -> dict[str, Any]:
    campaign = bench_campaign(rows, run_dir)
    store = RunStore(str(run_dir))
    t0 = time.perf_counter()
    written, steps = 0, 0
    units = {}
    arm_specs = campaign.arms()
    for shape_index, (shape_name, shape) in enumerate(campaign.shapes.items()):
        offsets = shape_arrivals(shape, seed=zlib.crc32(shape_name.encode()) ^ seed)
        for arm_index, arm in enumerate(arm_specs):
            start_ns = START_NS + (arm_index * 3 + shape_index) * 10**14
            table = partition(arm, arm_index, shape_name, shape, offsets, start_ns, seed)
            unit = Unit(arm=arm.name, shape=shape_name, repeat=0)
            directory = run_dir / "traces" / f"arm={arm.name}" / f"shape={shape_name}"
            directory.mkdir(parents=True, exist_ok=True)
            # Named as merge_parts names a unit's merged file: the report counts the files under the unit's prefix.
            merged = directory / f"{unit.part_prefix}{MERGED_WORKER}-000000-bench.parquet"
            with pq.ParquetWriter(merged, FILE_SCHEMA, compression="zstd") as w:
                for begin in range(0, table.num_rows, 200_000):
                    w.write_table(table.slice(begin, 200_000), row_group_size=ROWS_PER_FILE * 100)
            steps_table = timeline(arm, shape, start_ns, seed)
            timeline_dir = run_dir / "timelines" / f"arm={arm.name}" / f"shape={shape_name}"
            timeline_dir.mkdir(parents=True, exist_ok=True)
            pq.write_table(steps_table, timeline_dir / "r0.parquet", compression="zstd")
            result = UnitResult(
                unit=unit, start_ns=start_ns, end_ns=int(pc.max(steps_table["end_ns"]).as_py()),
                duration_s=shape.duration, scheduled=table.num_rows, rows=table.num_rows, saturated=False,
                lateness_p99_s=0.0005, workers=[], timeline_steps=steps_table.num_rows,
            )  # fmt: skip
            store.write_json(store.unit_marker(unit), result.model_dump(mode="json"))
            units[unit.key] = {"rows": table.num_rows, "scheduled": table.num_rows}
            written += table.num_rows
            steps += steps_table.num_rows
    manifest = {
        "campaign": campaign.model_dump(mode="json", by_alias=True),
        "run": "r1",
        "mode": "virtual",
        "arms": {a.name: {"policy": a.policy.label, "topology": a.topology.label} for a in arm_specs},
        "units": units,
    }
    store.write_json("manifest.json", manifest)
    size = sum(p.stat().st_size for p in (run_dir / "traces").rglob("*.parquet"))
    return {"rows": written, "timeline_steps": steps, "generate_s": round(time.perf_counter() - t0, 1),
            "trace_bytes": size}  # fmt: skip


def bytes_per_request(seed: int, rows: int = 100_000) -> dict[str, float]:
    """One unit of the dynamic arm, written as the load worker does (1000-row zstd part files), with the
    per-step lists (schema 1's rows, and version 2 with store_step_lists) and without (the default)."""
    campaign = bench_campaign(rows * 4 * 3, Path(tempfile.gettempdir()) / "unused")
    arm = campaign.arms()[2]
    shape = campaign.shapes["ramp"]
    offsets = shape_arrivals(shape, seed=seed)[:rows]
    out = {}
    for lists in (True, False):
        table = partition(arm, 2, "ramp", shape, offsets, START_NS, seed, step_lists=lists)
        size = 0
        for begin in range(0, table.num_rows, ROWS_PER_FILE):
            sink = pa.BufferOutputStream()
            pq.write_table(table.slice(begin, ROWS_PER_FILE), sink, compression="zstd")
            size += sink.getvalue().size
        out["with_step_lists" if lists else "without_step_lists"] = round(size / table.num_rows, 1)
    return out


# --- stages ----------------------------------------------------------------------------------------------------
def _peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM): getrusage's ru_maxrss would carry the parent's peak over the
    exec of a stage process (Linux keeps it across execve)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _started() -> tuple[float, float]:
    """Wall and CPU clocks at the start of a stage's work: after its imports, which are not the analysis."""
    return time.perf_counter(), _cpu_s()


def _measured(started: tuple[float, float], **extra: Any) -> dict[str, Any]:
    wall, cpu = started
    return {
        "seconds": time.perf_counter() - wall, "cpu_s": _cpu_s() - cpu, "peak_rss_bytes": _peak_rss_bytes(), **extra,
    }  # fmt: skip


def _edges_case(column: str, edges: list[float]) -> str:
    cases = " ".join(f"WHEN {column} < {high} THEN {i}" for i, high in enumerate(edges[1:]))
    return f"CASE WHEN {column} IS NULL OR {column} < {edges[0]} THEN -1 {cases} ELSE {len(edges) - 1} END"


def run_plain_maps(run_dir: Path) -> dict[str, Any]:
    import duckdb

    t0 = _started()
    batch = _edges_case("step_batch_mean", [1, 65, 129, 513])
    rate = _edges_case("offered_rate_rps", [0, 20, 40, 60, 80])
    result = duckdb.sql(
        f"""
        SELECT arm, bb, rb, count(*), quantile_cont(ttft_s, [0.5, 0.9, 0.99]), quantile_cont(tpot_s, [0.5, 0.9, 0.99])
        FROM (SELECT arm, ttft_s, tpot_s, {batch} AS bb, {rate} AS rb
              FROM read_parquet('{run_dir}/traces/*/*/*.parquet', hive_partitioning = true))
        GROUP BY GROUPING SETS ((arm, bb), (arm, rb))
        """
    ).fetchall()
    return _measured(t0, groups=len(result))


def run_plain_map_inputs(run_dir: Path) -> dict[str, Any]:
    """What the maps read and aggregate, without pairing, twins or bootstrap: the 13 input columns in one scan,
    per (arm, band) of both band sets, their sums and the four measures' exact quantiles."""
    import duckdb

    t0 = _started()
    batch = _edges_case("step_batch_mean", [1, 65, 129, 513])
    rate = _edges_case("offered_rate_rps", [0, 20, 40, 60, 80])
    q = "[0.5, 0.9, 0.99]"
    result = duckdb.sql(
        f"""
        SELECT arm, bb, rb, category, count(*), sum(engine_steps), sum(step_k_sum), sum(spec_steps),
               sum(accepted_tokens), sum(scheduled_ns - unit_start_ns), sum(request_index), count_if(status = 'ok'),
               quantile_cont(ttft_s, {q}), quantile_cont(tpot_s, {q}), quantile_cont(e2e_s, {q}),
               quantile_cont(queue_wait_s, {q})
        FROM (SELECT *, {batch} AS bb, {rate} AS rb
              FROM read_parquet('{run_dir}/traces/*/*/*.parquet', hive_partitioning = true))
        GROUP BY GROUPING SETS ((arm, bb, category), (arm, rb, category))
        """
    ).fetchall()
    return _measured(t0, groups=len(result))


def run_plain_steps(run_dir: Path) -> dict[str, Any]:
    import duckdb

    t0 = _started()
    result = duckdb.sql(
        f"SELECT arm, batch_size, k, count(*) FROM read_parquet('{run_dir}/timelines/*/*/*.parquet', "
        "hive_partitioning = true) GROUP BY ALL"
    ).fetchall()
    return _measured(t0, groups=len(result))


def run_maps(run_dir: Path) -> dict[str, Any]:
    from orchestrator.analysis.opmap.operating_map import operating_maps
    from orchestrator.analysis.read.inputs import load_run
    from orchestrator.analysis.read.views import run_requests
    from orchestrator.analysis.summary import offered_rate_bands, schedule_bands

    t0 = _started()
    inputs = load_run(str(run_dir))
    units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units]
    requests = run_requests(str(run_dir), units)
    band_sets = [schedule_bands(inputs.campaign)]
    rate_bands = offered_rate_bands(requests)
    if rate_bands is not None:
        band_sets.append(rate_bands)
    maps = operating_maps(requests, inputs.arms, inputs.campaign.slo, band_sets)
    return _measured(
        t0, crossovers=[c.message for m in maps for c in m.crossovers], cells=sum(len(m.cells) for m in maps)
    )


def run_verify(run_dir: Path) -> dict[str, Any]:
    from orchestrator.analysis.read.inputs import load_run
    from orchestrator.analysis.read.views import run_requests
    from orchestrator.analysis.summary import schedule_bands
    from orchestrator.analysis.verify.executed import verify_executed_policy

    t0 = _started()
    inputs = load_run(str(run_dir))
    units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units]
    requests = run_requests(str(run_dir), units)
    report = verify_executed_policy(
        requests, inputs.arms, shapes=dict(inputs.campaign.shapes), bands=schedule_bands(inputs.campaign)
    )
    return _measured(
        t0,
        failed_findings=[f.message for a in report.arms for f in a.findings if not f.passed],
        switch_timings=[t.message for t in report.switch_timings],
    )


def run_report(run_dir: Path) -> dict[str, Any]:
    from orchestrator.report.build import write_report

    t0 = _started()
    summary = write_report(str(run_dir))
    return _measured(t0, passed=summary.passed)


STAGES = {
    "plain_maps": run_plain_maps,
    "plain_map_inputs": run_plain_map_inputs,
    "maps": run_maps,
    "plain_steps": run_plain_steps,
    "verify": run_verify,
    "report": run_report,
}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _stage(name: str, run_dir: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--stage", name, "--root", str(run_dir)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"stage {name} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(rows: int, seed: int, repeats: int, root: Path | None) -> dict[str, Any]:
    keep = root is not None
    run_dir = root or Path(tempfile.mkdtemp(prefix="specdrill-bench-"))
    try:
        generated: dict[str, Any] = {"rows": rows, "reused": True}
        if not (run_dir / "manifest.json").exists():
            generated = generate(run_dir, rows, seed)
        print(json.dumps({"generated": generated}), flush=True)
        # Stages interleave, repeat by repeat, so a neighbour's load on a shared machine hits them alike.
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in STAGES}
        for _ in range(repeats):
            for name in STAGES:
                runs[name].append(_stage(name, run_dir))
                print(json.dumps({name: runs[name][-1]}), flush=True)
        best = {name: min(r, key=lambda x: x["seconds"]) for name, r in runs.items()}
        return {"generated": generated, "stages": best}
    finally:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 400_000, 1_000_000, 10_000_000])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--root", type=Path, default=None, help="a run directory to create or reuse (kept)")
    parser.add_argument("--stage", choices=sorted(STAGES), default=None)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per stage; the best is reported")
    args = parser.parse_args()
    if args.stage:
        # CPU time as well as wall time: on a shared machine the wall clock moves with the neighbours' load.
        print(json.dumps(STAGES[args.stage](args.root)))
        return
    if args.root is not None and len(args.rows) > 1:
        parser.error("--root keeps one run directory: give one --rows with it")
    figures: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, {platform.platform()}",
        "bytes_per_request": bytes_per_request(args.seed),
    }
    print(json.dumps({"bytes_per_request": figures["bytes_per_request"]}), flush=True)
    for rows in args.rows:
        result = measure(rows, args.seed, args.repeats, args.root)
        stages = result["stages"]

        def seconds(name: str, stages: dict[str, Any] = stages) -> float:
            return round(float(stages[name]["seconds"]), 2)

        def cpu(name: str, stages: dict[str, Any] = stages) -> float:
            return round(float(stages[name]["cpu_s"]), 2)

        def gib(name: str, stages: dict[str, Any] = stages) -> float:
            return round(float(stages[name]["peak_rss_bytes"]) / 2**30, 2)

        figures[str(rows)] = {
            "timeline_steps": result["generated"].get("timeline_steps"),
            "trace_bytes": result["generated"].get("trace_bytes"),
            "seconds": {name: seconds(name) for name in STAGES},
            "cpu_s": {name: cpu(name) for name in STAGES},
            "peak_rss_gib": {name: gib(name) for name in STAGES},
            "peak_rss_bytes_report": stages["report"]["peak_rss_bytes"],
            "maps_vs_plain_aggregate": round(seconds("maps") / seconds("plain_maps"), 2),
            "verify_vs_plain_histogram": round(seconds("verify") / seconds("plain_steps"), 2),
            "maps_vs_plain_aggregate_cpu": round(cpu("maps") / cpu("plain_maps"), 2),
            "maps_vs_plain_map_inputs": round(seconds("maps") / seconds("plain_map_inputs"), 2),
            "maps_vs_plain_map_inputs_cpu": round(cpu("maps") / cpu("plain_map_inputs"), 2),
            "verify_vs_plain_histogram_cpu": round(cpu("verify") / cpu("plain_steps"), 2),
        }
        print(json.dumps({str(rows): figures[str(rows)]}), flush=True)
    base = 1_000_000 if 1_000_000 in args.rows else min(args.rows)  # the 10M-row target is against 1M rows
    if max(args.rows) > base:
        low, high = (figures[str(r)]["peak_rss_gib"]["report"] for r in (base, max(args.rows)))
        figures["report_rss_growth"] = round(high / low - 1, 3)
    # Memory flat: the report's peak RSS on 4x the rows within 1.25x (from the bytes, not the rounded GiB).
    for low_rows in sorted(r for r in args.rows if 4 * r in args.rows):
        low, high = (float(figures[str(r)]["peak_rss_bytes_report"]) for r in (low_rows, 4 * low_rows))
        figures[f"report_rss_ratio_{low_rows}_to_{4 * low_rows}"] = {
            "ratio": round(high / low, 3), "target": RSS_RATIO_TARGET, "met": high / low <= RSS_RATIO_TARGET,
        }  # fmt: skip
    print(json.dumps({"summary": figures}, indent=2))


if __name__ == "__main__":
    main()
