"""cross_and_recover runs: after the load crosses the schedule boundary, how long until the executed k follows,
and after it comes back down, how long until k returns.

Steps are put in time bins; a bin's k is the k most of its steps executed. A step's time is its start on the
engine step timeline, or, for arms without one (endpoints), its share of its request's time in the engine. The
crossing comes from the shape (crossing_offsets: when the offered rate passed boundary_rate) or from the
telemetry (the first bin whose steps' batch sizes mostly configure a different k than the quiet start did).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from loadshapes.shapes import CrossAndRecover, ShapeBase
from orchestrator.analysis.arms import ArmInfo
from orchestrator.analysis.results import SwitchTiming

Reference = Literal["shape", "batch"]


@dataclass(frozen=True)
class TimedRun:
    """One run's engine steps in time: seconds from the run's start (NaN where unknown), batch size, k."""

    run: tuple[str, str, str, int]  # arm, shape, run, repeat
    time_s: np.ndarray
    batch: np.ndarray
    k: np.ndarray


def _mode(values: np.ndarray) -> int | None:
    return int(np.bincount(values).argmax()) if len(values) else None


def _bin_modes(bins: np.ndarray, values: np.ndarray, n_bins: int) -> np.ndarray:
    """Per bin, the most frequent value; -1 for a bin without steps."""
    width = int(values.max()) + 1
    counts = np.bincount(bins * width + values, minlength=n_bins * width).reshape(n_bins, width)
    modes: np.ndarray = np.where(counts.sum(axis=1) > 0, counts.argmax(axis=1), -1)
    return modes


def _first_bin(condition: np.ndarray, start: int) -> int | None:
    hits = np.flatnonzero(condition[start:])
    return int(start + hits[0]) if len(hits) else None


def _timing(
    *,
    arm: ArmInfo,
    run: tuple[str, str, str, int],
    shape: CrossAndRecover,
    time_s: np.ndarray,
    batch: np.ndarray,
    executed: np.ndarray,
    configured: np.ndarray,
    reference: Reference,
    bin_s: float,
    bound_s: float,
) -> SwitchTiming:
    _, shape_name, run_name, repeat = run
    where = f"{arm.name} on {shape_name} (run {run_name}, repeat {repeat})"
    up_shape, down_shape = shape.crossing_offsets()
    usable = np.isfinite(time_s) & (time_s >= 0)
    time_s, batch, executed, configured = time_s[usable], batch[usable], executed[usable], configured[usable]
    bins = (time_s / bin_s).astype(np.int64)
    n_bins = int(bins.max()) + 1 if len(bins) else 0
    before = time_s < up_shape
    quiet_k, quiet_configured = _mode(executed[before]), _mode(configured[before])

    def result(passed: bool, message: str, **values: float | int | None) -> SwitchTiming:
        fields: dict[str, float | int | None] = dict.fromkeys(
            ("crossed_up_s", "switched_s", "switch_lag_s", "crossed_down_s", "recovered_s", "recovery_s", "loaded_k")
        )
        fields.update(values)
        return SwitchTiming.model_validate(
            {
                "arm": arm.name,
                "shape": shape_name,
                "run": run_name,
                "repeat": repeat,
                "reference": reference,
                "quiet_k": quiet_k,
                "bound_s": bound_s,
                "passed": passed,
                "message": f"{where}: {message}",
                **fields,
            }
        )

    if quiet_k is None or quiet_configured is None:
        return result(False, f"no engine steps before the load crossed up at {up_shape:.1f} s: cannot time a switch")
    configured_modes = _bin_modes(bins, configured, n_bins)
    executed_modes = _bin_modes(bins, executed, n_bins)
    loaded = (configured_modes >= 0) & (configured_modes != quiet_configured)
    if not loaded.any():
        return result(
            True,
            f"not exercised: the batch (max {int(batch.max())}) never reached a schedule range "
            f"with k other than {quiet_configured}",
        )
    if reference == "shape":
        up, down = up_shape, down_shape
    else:
        loaded_bins = np.flatnonzero(loaded)
        up, down = float(loaded_bins[0] * bin_s), float((loaded_bins[-1] + 1) * bin_s)
    loaded_k = _mode(executed[(time_s >= up) & (time_s < down)])
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
    runs: Sequence[TimedRun],
    arms: Sequence[ArmInfo],
    shapes: Mapping[str, ShapeBase],
    *,
    reference: Reference = "shape",
    bin_s: float = 1.0,
    bound_s: float = 10.0,
) -> list[SwitchTiming]:
    """One timing per (dynamic arm, cross_and_recover run) in `runs`."""
    by_name = {a.name: a for a in arms}
    timings = []
    for timed in runs:
        arm_name, shape_name, _, _ = timed.run
        arm, shape = by_name.get(arm_name), shapes.get(shape_name)
        if arm is None or arm.kind != "dynamic" or not isinstance(shape, CrossAndRecover):
            continue
        batch = np.clip(timed.batch, 0, arm.max_num_seqs)
        timings.append(
            _timing(
                arm=arm,
                run=timed.run,
                shape=shape,
                time_s=timed.time_s,
                batch=batch,
                executed=timed.k.astype(np.int64),
                configured=arm.k_table()[batch],
                reference=reference,
                bin_s=bin_s,
                bound_s=bound_s,
            )
        )
    return timings
