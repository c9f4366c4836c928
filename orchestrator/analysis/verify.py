"""Did each arm execute the draft length its policy configures? Proven from per-step telemetry, not from config.

Every engine step reports its batch size and the k it executed; the configured k for that batch comes from the
arm's policy as written (not as vLLM resolved it), so a schedule vLLM dropped shows up as a mismatch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from loadshapes.shapes import _Shape as ShapeLike
from orchestrator.analysis.arms import ArmInfo
from orchestrator.analysis.bands import BandSet, batch_bands
from orchestrator.analysis.clock import RunKey, encode, run_clock
from orchestrator.analysis.lists import list_sums
from orchestrator.analysis.parallel import run_parallel
from orchestrator.analysis.recovery import switch_timings
from orchestrator.analysis.results import ArmVerification, BandKCheck, Finding, VerificationReport
from orchestrator.analysis.steps import step_columns, step_histogram

VERIFY_COLUMNS = (
    "arm",
    "shape",
    "run",
    "request_id",
    "scheduled_ns",
    "sent_ns",
    "done_ns",
    "server_first_scheduled_ns",
    "server_done_ns",
    "step_batch_size",
    "step_k",
    "per_step_drafted",
    "schedule_dropped",
    "resolved_speculative_config",
)


class VerifySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min_match_fraction: float = Field(default=0.99, ge=0, le=1)  # steps whose executed k is the configured k
    fallback_share: float = Field(default=0.9, gt=0, le=1)  # of steps configured below max k that ran max k
    min_steps: int = Field(default=20, ge=1)  # fewer steps in a check's scope: not exercised
    bin_s: float = Field(default=1.0, gt=0)  # time resolution of switch timing
    switch_bound_s: float = Field(default=10.0, gt=0)
    reference: Literal["shape", "batch"] = "shape"


def _k_tables(arms: Sequence[ArmInfo], batch_limit: int) -> np.ndarray:
    """(arms, batch sizes 0..batch_limit) configured k; past an arm's max_num_seqs its last k (vLLM's tail)."""
    tables = np.zeros((len(arms), batch_limit + 1), dtype=np.int64)
    for i, arm in enumerate(arms):
        table = arm.k_table()
        tables[i, : len(table)] = table
        tables[i, len(table) :] = table[-1]
    return tables


def _share(part: float, whole: float) -> float | None:
    return float(part / whole) if whole else None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _k_set(values: Sequence[int] | np.ndarray) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


@dataclass(frozen=True)
class _ArmTelemetry:
    """Per-arm facts from the request rows, beyond the steps."""

    rows: int
    drafted_tokens: int
    dropped_rows: int
    config_rows: int
    schedule_in_config: bool  # some reported config still carries num_speculative_tokens_per_batch_size


def _telemetry(table: pa.Table, row_arm: np.ndarray, n_arms: int) -> list[_ArmTelemetry]:
    configs = encode(table["resolved_speculative_config"])
    parsed = [json.loads(text) if text else None for text in configs.names]
    # Indexed by config code, with a last entry for rows that report none (code -1).
    has_config = np.array([c is not None for c in parsed] + [False])
    carries_schedule = np.array(
        [isinstance(c, dict) and bool(c.get("num_speculative_tokens_per_batch_size")) for c in parsed] + [False]
    )
    config = configs.codes
    arm = np.where(row_arm >= 0, row_arm, n_arms)  # unconfigured rows go to a bin that is dropped

    def per_arm(weights: np.ndarray | None = None) -> np.ndarray:
        totals: np.ndarray = np.bincount(arm, weights=weights, minlength=n_arms + 1)[:n_arms]
        return totals

    rows = per_arm()
    drafted = per_arm(list_sums(table["per_step_drafted"])[0])
    dropped = per_arm(table["schedule_dropped"].fill_null(False).to_numpy(zero_copy_only=False).astype(np.float64))
    with_config = per_arm(has_config[config].astype(np.float64))
    with_schedule = per_arm(carries_schedule[config].astype(np.float64))
    return [
        _ArmTelemetry(
            rows=int(rows[a]),
            drafted_tokens=int(drafted[a]),
            dropped_rows=int(dropped[a]),
            config_rows=int(with_config[a]),
            schedule_in_config=bool(with_schedule[a] > 0),
        )
        for a in range(n_arms)
    ]


def _identity(arm: ArmInfo, t: _ArmTelemetry, steps: int, k_steps: int, zero_steps: int) -> Finding:
    """Tell `off` (no speculative config, no drafts) from `dynamic` whose schedule gives k = 0."""
    if arm.kind == "off":
        problems = []
        if t.config_rows:
            problems.append(f"the engine reports a speculative config on {t.config_rows} requests")
        if k_steps:
            problems.append(f"{k_steps} steps ran k > 0")
        if t.drafted_tokens:
            problems.append(f"{t.drafted_tokens} draft tokens were verified")
        if problems:
            return Finding(
                check="identity",
                arm=arm.name,
                passed=False,
                message=f"{arm.name}: declared off, but " + "; ".join(problems),
            )
        return Finding(
            check="identity",
            arm=arm.name,
            passed=True,
            message=f"{arm.name}: really off: no speculative config, k = 0 in all {steps} steps, no drafts",
        )
    if not (t.config_rows or k_steps or t.drafted_tokens):
        return Finding(
            check="identity",
            arm=arm.name,
            passed=False,
            message=(
                f"{arm.name}: declared {arm.kind}, but no speculative config, no step with k > 0 and no drafts: "
                "it ran as off"
            ),
        )
    zero = f"; k = 0 in {_pct(_share(zero_steps, steps))} of steps" if zero_steps else ""
    evidence = "the engine reports its speculative config" if t.config_rows else "steps ran k > 0"
    return Finding(
        check="identity",
        arm=arm.name,
        passed=True,
        message=f"{arm.name}: {arm.kind}, not off: {evidence}{zero}",
    )


def _band_checks(
    arm: ArmInfo,
    counts: np.ndarray,
    table: np.ndarray,
    band_of_batch: np.ndarray,
    bands: BandSet,
    settings: VerifySettings,
) -> list[BandKCheck]:
    """`counts`: (batch sizes, k) steps of one arm; `table`: its configured k per batch size."""
    k_width = counts.shape[1]
    matched = np.where(table < k_width, np.take_along_axis(counts, np.minimum(table, k_width - 1)[:, None], 1)[:, 0], 0)
    checks = []
    for b, spec in enumerate(bands.bands):
        in_band = band_of_batch == b
        by_k = counts[in_band].sum(axis=0)
        steps = int(by_k.sum())
        if not steps:
            continue
        low, high = int(max(spec.low, 1)), int(min(spec.upper - 1, arm.max_num_seqs))
        configured = sorted({int(k) for k in table[low : high + 1]}) if low <= high else [int(table[-1])]
        fraction = float(matched[in_band].sum() / steps)
        checks.append(
            BandKCheck(
                band=spec.label,
                steps=steps,
                configured_k=configured,
                executed_k={str(k): float(n / steps) for k, n in enumerate(by_k) if n},
                mean_executed_k=float(np.dot(np.arange(k_width), by_k) / steps),
                match_fraction=fraction,
                passed=fraction >= settings.min_match_fraction,
            )
        )
    return checks


def _verify_arm(
    arm: ArmInfo,
    counts: np.ndarray,
    table: np.ndarray,
    telemetry: _ArmTelemetry,
    bands: BandSet,
    settings: VerifySettings,
    mismatched_requests: int,
) -> ArmVerification:
    k_width = counts.shape[1]
    by_batch = counts.sum(axis=1)
    by_k = counts.sum(axis=0)
    steps = int(by_batch.sum())
    matched = np.where(table < k_width, np.take_along_axis(counts, np.minimum(table, k_width - 1)[:, None], 1)[:, 0], 0)
    band_of_batch = bands.assign(np.arange(len(table), dtype=np.float64))
    band_checks = _band_checks(arm, counts, table, band_of_batch, bands, settings)
    findings = [
        _identity(arm, telemetry, steps, int(by_k[1:].sum()), int(by_k[0]) if k_width else 0),
        _executed_k_finding(arm, steps, float(matched.sum()), band_checks, settings),
    ]
    if arm.kind == "dynamic":
        seen = np.flatnonzero(by_batch)
        low, high = (int(seen[0]), int(seen[-1])) if len(seen) else (0, 0)
        below_max = table < arm.k
        ran_max = int(counts[below_max, arm.k].sum()) if arm.k < k_width else 0
        configured_values = np.flatnonzero(np.bincount(table, weights=by_batch))
        findings += [
            _dropped_finding(arm, telemetry),
            _fallback_finding(arm, int(by_batch[below_max].sum()), ran_max, settings),
            _switched_finding(arm, np.flatnonzero(by_k), configured_values, steps, low, high, settings),
        ]
    if mismatched_requests:
        findings.append(
            Finding(
                check="telemetry",
                arm=arm.name,
                passed=True,
                message=(
                    f"{mismatched_requests} requests report step_k and step_batch_size of different lengths; "
                    "only their common steps were checked"
                ),
            )
        )
    return ArmVerification(
        arm=arm.name,
        kind=arm.kind,
        topology=arm.topology,
        steps=steps,
        match_fraction=_share(float(matched.sum()), steps),
        bands=band_checks,
        findings=findings,
        passed=all(f.passed for f in findings),
    )


def verify_executed_policy(
    table: pa.Table,
    arms: Sequence[ArmInfo],
    *,
    shapes: Mapping[str, ShapeLike] | None = None,
    bands: BandSet | None = None,
    settings: VerifySettings | None = None,
    run_starts: Mapping[RunKey, int] | None = None,
) -> VerificationReport:
    settings = settings or VerifySettings()
    bands = bands or batch_bands()
    clock, steps = run_parallel(lambda: run_clock(table, run_starts=run_starts), lambda: step_columns(table))
    names = [a.name for a in arms]
    unknown = sorted(set(clock.arm.names) - set(names))
    if unknown:
        raise ValueError(f"trace has arms with no ArmInfo: {', '.join(unknown)}")
    row_arm = np.array([names.index(n) for n in clock.arm.names] + [-1], dtype=np.int64)[clock.arm.codes]
    batch_limit = max(a.max_num_seqs for a in arms) + 1  # one bucket past every table: the tail's k
    histogram = step_histogram(steps, row_arm, len(arms), batch_limit)
    tables = _k_tables(arms, batch_limit)
    telemetry = _telemetry(table, row_arm, len(arms))
    results = [
        _verify_arm(arm, histogram[i], tables[i], telemetry[i], bands, settings, steps.mismatched_requests)
        for i, arm in enumerate(arms)
    ]
    timings = (
        switch_timings(
            table,
            clock,
            steps,
            arms,
            shapes,
            reference=settings.reference,
            bin_s=settings.bin_s,
            bound_s=settings.switch_bound_s,
        )
        if shapes
        else []
    )
    return VerificationReport(
        arms=results, switch_timings=timings, passed=all(r.passed for r in results) and all(t.passed for t in timings)
    )


def _executed_k_finding(
    arm: ArmInfo, steps: int, matched: float, band_checks: list[BandKCheck], settings: VerifySettings
) -> Finding:
    if steps == 0:
        return Finding(check="executed_k", arm=arm.name, passed=False, message=f"{arm.name}: no engine steps reported")
    fraction = matched / steps
    if fraction >= settings.min_match_fraction:
        return Finding(
            check="executed_k",
            arm=arm.name,
            passed=True,
            message=f"{arm.name}: executed k = configured k in {_pct(fraction)} of {steps} steps",
        )
    worst = min(band_checks, key=lambda c: c.match_fraction if c.match_fraction is not None else 1.0)
    ran = ", ".join(f"k={k} {_pct(share)}" for k, share in sorted(worst.executed_k.items(), key=lambda kv: -kv[1]))
    return Finding(
        check="executed_k",
        arm=arm.name,
        passed=False,
        band=worst.band,
        message=(
            f"{arm.name}: executed k = configured k in only {_pct(fraction)} of {steps} steps; worst band "
            f"{worst.band}: configured {_k_set(worst.configured_k)}, executed {ran}"
        ),
    )


def _dropped_finding(arm: ArmInfo, t: _ArmTelemetry) -> Finding:
    if t.dropped_rows or (t.config_rows and not t.schedule_in_config):
        evidence = (
            f"schedule_dropped on {t.dropped_rows} of {t.rows} requests"
            if t.dropped_rows
            else "the engine's resolved config has no num_speculative_tokens_per_batch_size"
        )
        why = (
            f" (topology {arm.topology}: vLLM drops schedules under data parallelism)"
            if arm.expects_static_fallback
            else ""
        )
        return Finding(
            check="schedule_dropped",
            arm=arm.name,
            passed=False,
            message=f"{arm.name}: the engine dropped the schedule: {evidence}{why}",
        )
    return Finding(
        check="schedule_dropped", arm=arm.name, passed=True, message=f"{arm.name}: the engine kept the schedule"
    )


def _fallback_finding(arm: ArmInfo, below: int, ran_max: int, settings: VerifySettings) -> Finding:
    if below < settings.min_steps:
        return Finding(
            check="static_fallback",
            arm=arm.name,
            passed=True,
            message=f"{arm.name}: not exercised: {below} steps at batch sizes whose k is below max k {arm.k}",
        )
    share = ran_max / below
    if share >= settings.fallback_share:
        cause = (
            f"vLLM's data-parallel fallback (topology {arm.topology})"
            if arm.expects_static_fallback
            else "the schedule was not applied"
        )
        return Finding(
            check="static_fallback",
            arm=arm.name,
            passed=False,
            message=(
                f"{arm.name}: ran the static max k = {arm.k} in {_pct(share)} of the {below} steps where the "
                f"schedule gives less: {cause}"
            ),
        )
    return Finding(
        check="static_fallback",
        arm=arm.name,
        passed=True,
        message=f"{arm.name}: no static fallback: max k = {arm.k} in {_pct(share)} of {below} steps scheduled below it",
    )


def _switched_finding(
    arm: ArmInfo,
    executed: np.ndarray,
    configured: np.ndarray,
    steps: int,
    low: int,
    high: int,
    settings: VerifySettings,
) -> Finding:
    if steps < settings.min_steps or len(configured) < 2:
        return Finding(
            check="schedule_switched",
            arm=arm.name,
            passed=True,
            message=(f"{arm.name}: not exercised: batch sizes {low}-{high} all configure k = {_k_set(configured)}"),
        )
    if len(executed) < 2:
        return Finding(
            check="schedule_switched",
            arm=arm.name,
            passed=False,
            message=(
                f"{arm.name}: the schedule never switched: executed k = {int(executed[0])} in all {steps} "
                f"steps although batch sizes {low}-{high} configure k = {_k_set(configured)}"
            ),
        )
    return Finding(
        check="schedule_switched",
        arm=arm.name,
        passed=True,
        message=(
            f"{arm.name}: executed k took {_k_set(executed)} over batch sizes {low}-{high} "
            f"(configured {_k_set(configured)})"
        ),
    )
