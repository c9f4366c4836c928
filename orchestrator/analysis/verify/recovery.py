"""cross_and_recover runs: after the load crosses the schedule boundary, how long until the executed k follows,
and after it comes back down, how long until k returns.

Steps are put in time bins; a bin's k is the k most of its steps executed. A step's time is its start on the
engine step timeline, or, for arms without one (endpoints), its share of its request's time in the engine. The
crossing comes from the shape (crossing_offsets: when the offered rate passed boundary_rate) or from the
telemetry (the first bin whose steps' batch sizes mostly configure a different k than the quiet start did).

DuckDB counts the steps per (run, time bin, configured k, executed k) with the few flags the timing needs beyond
the bin (which side of the shape's crossings a step's time lies on, and whether the division that binned it
rounded across a bin edge); numpy works on those counts, never on the steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import duckdb
import numpy as np
import pyarrow as pa

from loadshapes.shapes import CrossAndRecover, ShapeBase
from orchestrator.analysis.opmap.results import SwitchTiming
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import RunKey

Reference = Literal["shape", "batch"]

# `steps`: one row per step (run_id, time_s, batch_size, k). A step with no usable time (NULL, NaN, negative)
# gets bin -1: it is left out, but a run of only such steps still gets a timing (one that says so). `side`: 0
# before the shape's up crossing, 1 between its crossings, 2 after (a time, not a bin edge: the bin holding a
# crossing has steps on both sides).
_BINNED_SQL = """
SELECT run_id, bin, CASE WHEN time_s < up_s THEN 0 WHEN time_s < down_s THEN 1 ELSE 2 END AS side,{edges}
       configured, k AS executed, count(*) AS count, max(batch) AS max_batch
FROM (
    SELECT s.*, t.configured,
           CASE WHEN isfinite(s.time_s) AND s.time_s >= 0 THEN floor(s.time_s / s.bin_s)::BIGINT ELSE -1 END AS bin
    FROM (
        SELECT s.run_id, s.time_s, s.k, c.up_s, c.down_s, c.bin_s,
               least(greatest(s.batch_size, 0), c.max_num_seqs) AS batch
        FROM ({steps}) s JOIN switch_runs c USING (run_id)
    ) s
    JOIN switch_k_tables t USING (run_id, batch)
)
GROUP BY ALL
"""

# Whether the division that binned a step rounded across its bin's edge (its time below bin * bin_s, or at or
# past (bin + 1) * bin_s): the batch reference's window is in bin edges, compared with the steps' own times.
_EDGES_SQL = " time_s < bin * bin_s AS below_start, time_s >= (bin + 1) * bin_s AS past_end,"


@dataclass(frozen=True)
class BinnedRun:
    """One run's engine steps with a usable time, counted per group of (time bin, side of the shape's crossings,
    edge flags, configured k, executed k); no groups where none had one."""

    run: RunKey
    bin_s: float
    reference: Reference
    bin: np.ndarray  # floor(time / bin_s)
    side: np.ndarray  # 0: time < the shape's up crossing, 1: up <= time < down, 2: after
    below_start: np.ndarray  # time < bin * bin_s: the division rounded up onto this bin
    past_end: np.ndarray  # time >= (bin + 1) * bin_s: it rounded down onto this bin
    configured: np.ndarray
    executed: np.ndarray
    count: np.ndarray  # steps in the group
    max_batch: np.ndarray  # the largest batch size (clipped to max_num_seqs) among the group's steps


def _exact_bins(bin_s: float) -> bool:
    """A power-of-two bin divides and multiplies without rounding: a step's bin and its time always agree."""
    return math.frexp(bin_s)[0] == 0.5


def _switch_runs(
    runs: Sequence[tuple[int, RunKey]], arms: Mapping[str, ArmInfo], shapes: Mapping[str, CrossAndRecover],
    bin_s: float,
) -> pa.Table:  # fmt: skip
    rows = [(run_id, arms[key[0]], shapes[key[1]]) for run_id, key in runs]
    offsets = [shape.crossing_offsets() for _, _, shape in rows]
    return pa.table(
        {
            "run_id": pa.array([r[0] for r in rows], pa.int64()),
            "max_num_seqs": pa.array([arm.max_num_seqs for _, arm, _ in rows], pa.int64()),
            "up_s": pa.array([float(o[0]) for o in offsets], pa.float64()),
            "down_s": pa.array([float(o[1]) for o in offsets], pa.float64()),
            "bin_s": pa.array([float(bin_s)] * len(rows), pa.float64()),
        }
    )


def _k_tables(runs: Sequence[tuple[int, RunKey]], arms: Mapping[str, ArmInfo]) -> pa.Table:
    """(run_id, batch size, configured k) for batch sizes 0..max_num_seqs of each run's arm."""
    tables = [(run_id, arms[key[0]].k_table()) for run_id, key in runs]
    return pa.table(
        {
            "run_id": pa.array(np.concatenate([np.full(len(t), i) for i, t in tables]), pa.int64()),
            "batch": pa.array(np.concatenate([np.arange(len(t)) for _, t in tables]), pa.int64()),
            "configured": pa.array(np.concatenate([t for _, t in tables]), pa.int64()),
        }
    )


def binned_runs(
    con: duckdb.DuckDBPyConnection,
    steps_sql: str,
    params: Sequence[object],
    runs: Sequence[tuple[int, RunKey]],
    arms: Sequence[ArmInfo],
    shapes: Mapping[str, ShapeBase],
    *,
    bin_s: float,
    reference: Reference,
) -> list[BinnedRun]:
    """The steps of `steps_sql` (run_id, time_s in seconds from the run's start, batch_size, k) counted per bin,
    for the `runs` (run_id, key) of dynamic arms on cross_and_recover shapes; in run order."""
    by_arm = {a.name: a for a in arms if a.facts.switches_with_load}
    cross = {name: s for name, s in shapes.items() if isinstance(s, CrossAndRecover)}
    wanted = sorted(((i, key) for i, key in runs if key[0] in by_arm and key[1] in cross), key=lambda r: r[1])
    if not wanted:
        return []
    con.register("switch_runs", _switch_runs(wanted, by_arm, cross, bin_s))
    con.register("switch_k_tables", _k_tables(wanted, by_arm))
    # The edge flags cost a third of the query: only where they can be true and are read.
    edges = reference == "batch" and not _exact_bins(bin_s)
    sql = _BINNED_SQL.format(steps=steps_sql, edges=_EDGES_SQL if edges else "")
    found = con.sql(sql, params=list(params)).to_arrow_table()
    columns = {name: found[name].to_numpy(zero_copy_only=False) for name in found.column_names}
    order = np.argsort(columns["run_id"], kind="stable")
    run_ids = columns["run_id"][order]
    binned = []
    for run_id, key in wanted:
        mine = order[np.searchsorted(run_ids, run_id, "left") : np.searchsorted(run_ids, run_id, "right")]
        if not len(mine):
            continue  # a run without steps gets no timing
        mine = mine[columns["bin"][mine] >= 0]
        no_edge = np.zeros(len(mine), dtype=bool)
        binned.append(
            BinnedRun(
                run=key,
                bin_s=bin_s,
                reference=reference,
                bin=columns["bin"][mine].astype(np.int64),
                side=columns["side"][mine].astype(np.int64),
                below_start=columns["below_start"][mine].astype(bool) if edges else no_edge,
                past_end=columns["past_end"][mine].astype(bool) if edges else no_edge,
                configured=columns["configured"][mine].astype(np.int64),
                executed=columns["executed"][mine].astype(np.int64),
                count=columns["count"][mine].astype(np.int64),
                max_batch=columns["max_batch"][mine].astype(np.int64),
            )
        )
    return binned


def _mode(values: np.ndarray, weights: np.ndarray) -> int | None:
    """The most frequent value (the smallest among equals, as argmax takes the first)."""
    return int(np.bincount(values, weights=weights).argmax()) if len(values) else None


def _bin_modes(bins: np.ndarray, values: np.ndarray, weights: np.ndarray, n_bins: int) -> np.ndarray:
    """Per bin, the most frequent value; -1 for a bin without steps."""
    width = int(values.max()) + 1
    counts = np.bincount(bins * width + values, weights=weights, minlength=n_bins * width).reshape(n_bins, width)
    modes: np.ndarray = np.where(counts.sum(axis=1) > 0, counts.argmax(axis=1), -1)
    return modes


def _from_bin_start(binned: BinnedRun, edge: int) -> np.ndarray:
    """Groups whose time >= edge * bin_s. A group one bin off the edge is on its far side only where the
    division rounded across it; further off it cannot be (a whole bin is far more than a rounding)."""
    b = binned.bin
    found: np.ndarray = (b > edge) | ((b == edge) & ~binned.below_start) | ((b == edge - 1) & binned.past_end)
    return found


def _in_bins(binned: BinnedRun, first: int, end: int) -> np.ndarray:
    """Groups whose time is in [first * bin_s, end * bin_s), as the steps' own times compare."""
    found: np.ndarray = _from_bin_start(binned, first) & ~_from_bin_start(binned, end)
    return found


def _first_bin(condition: np.ndarray, start: int) -> int | None:
    hits = np.flatnonzero(condition[start:])
    return int(start + hits[0]) if len(hits) else None


def _switch_timing(
    run: RunKey, *, reference: Reference, quiet_k: int | None, bound_s: float, passed: bool, message: str,
    status: str | None = None, **values: float | int | None,
) -> SwitchTiming:  # fmt: skip
    """A run's timing: the times and k it found (`values`; the rest None), its status (from `passed` unless said)
    and its message, led by which arm, shape, run and repeat."""
    arm, shape, run_name, repeat = run
    fields: dict[str, float | int | None] = dict.fromkeys(
        ("crossed_up_s", "switched_s", "switch_lag_s", "crossed_down_s", "recovered_s", "recovery_s", "loaded_k")
    )
    fields.update(values)
    return SwitchTiming.model_validate(
        {
            "arm": arm,
            "shape": shape,
            "run": run_name,
            "repeat": repeat,
            "reference": reference,
            "quiet_k": quiet_k,
            "bound_s": bound_s,
            "passed": passed,
            "status": status or ("pass" if passed else "fail"),
            "message": f"{arm} on {shape} (run {run_name}, repeat {repeat}): {message}",
            **fields,
        }
    )


def _timing(*, arm: ArmInfo, shape: CrossAndRecover, binned: BinnedRun, bound_s: float) -> SwitchTiming:
    up_shape, down_shape = shape.crossing_offsets()
    bin_s, reference, bins, weights = binned.bin_s, binned.reference, binned.bin, binned.count
    executed, configured = binned.executed, binned.configured
    n_bins = int(bins.max()) + 1 if len(bins) else 0
    before = binned.side == 0
    quiet_k = _mode(executed[before], weights[before])
    quiet_configured = _mode(configured[before], weights[before])

    def result(passed: bool, message: str, status: str | None = None, **values: float | int | None) -> SwitchTiming:
        return _switch_timing(binned.run, reference=reference, quiet_k=quiet_k, bound_s=bound_s, passed=passed,
                              message=message, status=status, **values)  # fmt: skip

    if quiet_k is None or quiet_configured is None:
        return result(False, f"no engine steps before the load crossed up at {up_shape:.1f} s: cannot time a switch")
    configured_modes = _bin_modes(bins, configured, weights, n_bins)
    executed_modes = _bin_modes(bins, executed, weights, n_bins)
    loaded = (configured_modes >= 0) & (configured_modes != quiet_configured)
    if not loaded.any():
        # No switch to time: neither a pass nor a failure. Steps at batch sizes of another k may still exist (the
        # per-band checks count them), only never most of a bin's.
        other = int(weights[configured != quiet_configured].sum())
        reached = (
            f"the batch (max {int(binned.max_batch.max())}) never reached a schedule range with k other than "
            f"{quiet_configured}"
            if other == 0
            else f"{other} of {int(weights.sum())} steps ran at batch sizes whose k is other than {quiet_configured}"
            f" (batch max {int(binned.max_batch.max())}), but in no {bin_s:g} s bin most of them"
        )
        return result(False, f"not exercised: {reached}: no switch to time", "not_exercised")
    if reference == "shape":
        up, down = up_shape, down_shape
        window = binned.side == 1
    else:
        loaded_bins = np.flatnonzero(loaded)
        up, down = float(loaded_bins[0] * bin_s), float((loaded_bins[-1] + 1) * bin_s)
        window = _in_bins(binned, int(loaded_bins[0]), int(loaded_bins[-1]) + 1)
    loaded_k = _mode(executed[window], weights[window])
    switched_bin = _first_bin((executed_modes >= 0) & (executed_modes != quiet_k), int(up // bin_s))
    if switched_bin is None:
        return result(
            False,
            f"executed k never changed from {quiet_k} after the load crossed up at {up:.1f} s",
            crossed_up_s=up,
            crossed_down_s=down,
            loaded_k=loaded_k,
        )
    switched = max(switched_bin * bin_s, up)
    recovered_bin = _first_bin(executed_modes == quiet_k, max(int(down // bin_s), switched_bin + 1))
    lag = switched - up
    if recovered_bin is None:
        return result(
            False,
            f"k {quiet_k} -> {executed_modes[switched_bin]} {lag:.1f} s after the load crossed up at {up:.1f} s, "
            f"never back to {quiet_k} after it came down at {down:.1f} s",
            crossed_up_s=up,
            switched_s=switched,
            switch_lag_s=lag,
            crossed_down_s=down,
            loaded_k=loaded_k,
        )
    recovered = max(recovered_bin * bin_s, down)
    recovery = recovered - down
    passed = lag <= bound_s and recovery <= bound_s
    return result(
        passed,
        f"k {quiet_k} -> {executed_modes[switched_bin]} {lag:.1f} s after the load crossed up at {up:.1f} s, back to "
        f"{quiet_k} {recovery:.1f} s after it came down at {down:.1f} s (bound {bound_s:g} s): "
        f"{'pass' if passed else 'FAIL'}",
        crossed_up_s=up,
        switched_s=switched,
        switch_lag_s=lag,
        crossed_down_s=down,
        recovered_s=recovered,
        recovery_s=recovery,
        loaded_k=loaded_k,
    )


def switch_timings(
    runs: Sequence[BinnedRun],
    arms: Sequence[ArmInfo],
    shapes: Mapping[str, ShapeBase],
    *,
    bound_s: float = 10.0,
) -> list[SwitchTiming]:
    """One timing per (load-switching arm, cross_and_recover run) in `runs` (binned_runs: its bins and reference)."""
    by_name = {a.name: a for a in arms}
    timings = []
    for binned in runs:
        arm_name, shape_name, _, _ = binned.run
        arm, shape = by_name.get(arm_name), shapes.get(shape_name)
        if arm is None or not arm.facts.switches_with_load or not isinstance(shape, CrossAndRecover):
            continue
        timings.append(_timing(arm=arm, shape=shape, binned=binned, bound_s=bound_s))
    return timings


def unverifiable_timings(
    runs: Sequence[RunKey], arms: Sequence[ArmInfo], shapes: Mapping[str, ShapeBase], reason: str, *, bound_s: float
) -> list[SwitchTiming]:
    """One "not verifiable" timing per (load-switching arm, cross_and_recover run) of an arm whose server shows no
    step's draft length: the load did cross, but nothing it reports can say when (or whether) k followed."""
    switching = {a.name for a in arms if a.facts.switches_with_load}
    return [
        _switch_timing(
            run,
            reference="shape",
            quiet_k=None,
            bound_s=bound_s,
            passed=False,
            status="not_verifiable",
            message=f"not verifiable: {reason}",
        )
        for run in sorted(runs)
        if run[0] in switching and isinstance(shapes.get(run[1]), CrossAndRecover)
    ]
