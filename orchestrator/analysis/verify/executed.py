"""Did each arm execute the draft length its policy configures? Proven from per-step telemetry, not from config.

Every engine step reports its batch size and the k it executed; the configured k for that batch comes from the
arm's policy as written (not as vLLM resolved it), so a schedule vLLM dropped shows up as a mismatch. The steps
come from the engine step timelines (one row per engine step) where the run has them; for arms without one
(endpoints, or a trace in memory) from the rows' per-step lists, where a step appears once per request in its
batch. Either way DuckDB reduces them to a histogram of (arm, batch size, k).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from loadshapes.shapes import ShapeBase
from orchestrator.analysis.opmap.bands import BandSet, batch_bands
from orchestrator.analysis.opmap.results import ArmVerification, BandKCheck, Finding, VerificationReport
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import Requests, request_frame
from orchestrator.analysis.read.telemetry import ArmTelemetry, arm_telemetry
from orchestrator.analysis.verify.endpoint import endpoint_findings, without_steps
from orchestrator.analysis.verify.findings import (
    dropped_finding,
    executed_k_finding,
    fallback_finding,
    identity_finding,
    one_k,
    share,
    switched_finding,
)
from orchestrator.analysis.verify.floor0 import floor0_finding
from orchestrator.analysis.verify.recovery import switch_timings, unverifiable_timings
from orchestrator.analysis.verify.replayed import Replayed, replayed
from orchestrator.analysis.verify.settings import VerifySettings
from orchestrator.analysis.verify.step_counts import binned_step_runs, endpoint_step_arms, run_ids, step_counts
from serve_apps.engine_kinds.dialects import vllm
from serve_apps.engine_kinds.dialects.base import Dialect


def _k_tables(arms: Sequence[ArmInfo], batch_limit: int) -> np.ndarray:
    """(arms, batch sizes 0..batch_limit) configured k; past an arm's max_num_seqs its last k (vLLM's tail)."""
    tables = np.zeros((len(arms), batch_limit + 1), dtype=np.int64)
    for i, arm in enumerate(arms):
        table = arm.k_table()
        tables[i, : len(table)] = table
        tables[i, len(table) :] = table[-1]
    return tables


def _matched(counts: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Per batch size, the steps whose executed k is the table's."""
    k_width = counts.shape[1]
    found: np.ndarray = np.where(
        table < k_width, np.take_along_axis(counts, np.minimum(table, k_width - 1)[:, None], 1)[:, 0], 0
    )
    return found


def _band_checks(
    arm: ArmInfo,
    counts: np.ndarray,
    table: np.ndarray,
    band_of_batch: np.ndarray,
    bands: BandSet,
    settings: VerifySettings,
    replay: Replayed | None = None,
) -> list[BandKCheck]:
    """`counts`: (batch sizes, k) steps of one arm; `table`: its configured k per batch size; `replay`: a stateful
    rule's k replayed on the steps (then the band's configured k are the rule's on its steps, not a table's)."""
    k_width = counts.shape[1]
    matched = _matched(counts, table) if replay is None else replay.matched
    checks = []
    for b, spec in enumerate(bands.bands):
        in_band = band_of_batch == b
        by_k = counts[in_band].sum(axis=0)
        steps = int(by_k.sum())
        if not steps:
            continue
        low, high = int(max(spec.low, 1)), int(min(spec.upper - 1, arm.max_num_seqs))
        if replay is not None:
            configured = [int(k) for k in np.flatnonzero(replay.expected[in_band].sum(axis=0))]
        elif low <= high:
            configured = sorted({int(k) for k in table[low : high + 1]})
        else:
            configured = [int(table[-1])]
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
    telemetry: ArmTelemetry,
    bands: BandSet,
    settings: VerifySettings,
    mismatched_requests: int,
    steps_without_k: int = 0,
    *,
    steps_skipped_drafts: int = 0,
    endpoint: bool = False,
    extra: Sequence[Finding] = (),
    replay: Replayed | None = None,
) -> ArmVerification:
    if replay is not None:  # a stateful rule: its steps come with the k the rule gives each
        counts = replay.executed
    k_width = counts.shape[1]
    by_batch = counts.sum(axis=1)
    by_k = counts.sum(axis=0)
    steps = int(by_batch.sum())
    matched = _matched(counts, table) if replay is None else replay.matched
    band_of_batch = bands.assign(np.arange(len(table), dtype=np.float64))
    band_checks = _band_checks(arm, counts, table, band_of_batch, bands, settings, replay)
    findings = [
        identity_finding(arm, telemetry, steps, int(by_k[1:].sum()), int(by_k[0]) if k_width else 0, endpoint=endpoint),
        executed_k_finding(
            arm, steps, float(matched.sum()), band_checks, settings, endpoint=endpoint, replayed=replay is not None
        ),
    ]
    if replay is None and arm.rule is not None:
        # No table to hold the steps against: the rule's k depends on the steps before, in their order
        findings[1] = Finding.not_verifiable(
            "executed_k", arm.name,
            f"{arm.name}: not verifiable: {arm.kind}'s k depends on the steps before; the check replays its rule on "
            "the engine step timeline, which this arm has none of",
        )  # fmt: skip
    elif replay is not None:
        findings += replay.findings
        if arm.expects_static_fallback:
            below, ran = replay.fallback
            findings.append(fallback_finding(arm, below, ran, settings, static_k=arm.fallback_k, rule=True))
    elif arm.facts.adaptive:  # a table by batch size: vLLM's schedule, TensorRT-LLM's schedule and cap
        seen = np.flatnonzero(by_batch)
        low, high = (int(seen[0]), int(seen[-1])) if len(seen) else (0, 0)
        below_max = table < arm.k
        ran_max = int(counts[below_max, arm.k].sum()) if arm.k < k_width else 0
        configured_values = np.flatnonzero(np.bincount(table, weights=by_batch))
        findings += [
            dropped_finding(arm, telemetry, endpoint=endpoint),
            fallback_finding(arm, int(by_batch[below_max].sum()), ran_max, settings),
            switched_finding(
                arm, np.flatnonzero(by_k), configured_values, steps, low, high, settings,
                one_k=one_k(arm),
            ),
        ]  # fmt: skip
    # Notes on what the counts left out, never a failure: skipped drafts are vLLM's design (0.33+ V2), not a policy
    # that failed to run, and are out of the share so they cannot dilute a mismatch either.
    notes = (
        (mismatched_requests, f"{mismatched_requests} requests report step_k and step_batch_size of different "
                              "lengths; only their common steps were checked"),
        (steps_without_k, f"{steps_without_k} engine step{'s' * (steps_without_k != 1)} reported no executed k; "
                          "left out"),
        (steps_skipped_drafts, f"{steps_skipped_drafts} steps skipped drafts (vLLM 0.33+ V2: no scheduled request "
                               "could use them); left out of the executed-k check"),
    )  # fmt: skip
    findings += [Finding(check="telemetry", arm=arm.name, passed=True, message=m) for n, m in notes if n]
    findings += extra
    return ArmVerification(
        arm=arm.name,
        kind=arm.kind,
        topology=arm.topology,
        steps=steps,
        match_fraction=share(float(matched.sum()), steps),
        bands=band_checks,
        findings=findings,
        passed=all(f.passed for f in findings),
    )


def verify_executed_policy(
    source: Requests | pa.Table,
    arms: Sequence[ArmInfo],
    *,
    shapes: Mapping[str, ShapeBase] | None = None,
    bands: BandSet | None = None,
    settings: VerifySettings | None = None,
    endpoint_samples: pa.Table | None = None,
    dialect: Dialect = vllm.DIALECT,
) -> VerificationReport:
    """`source`: a run's views (orchestrator.analysis.read.source), or a trace table in memory. `endpoint_samples`:
    the /metrics samples of endpoint arms (orchestrator.rundir.endpoint_samples.read_samples); every arm with samples is
    verified as a foreign server in `dialect` (its engine kind's): steps from what it reports per request, batch sizes
    from the samples, totals reconciled with its counters, and what it cannot show reported not verifiable."""
    requests = request_frame(source) if isinstance(source, pa.Table) else source
    try:
        chosen = settings or VerifySettings()
        return _verify(
            requests,
            arms,
            shapes=shapes,
            bands=bands or batch_bands(),
            settings=chosen,
            samples=endpoint_samples,
            dialect=dialect,
        )
    finally:
        if requests is not source:
            requests.close()


def _verify(
    requests: Requests,
    arms: Sequence[ArmInfo],
    *,
    shapes: Mapping[str, ShapeBase] | None,
    bands: BandSet,
    settings: VerifySettings,
    samples: pa.Table | None = None,
    dialect: Dialect = vllm.DIALECT,
) -> VerificationReport:
    names = [a.name for a in arms]
    unknown = sorted(set(requests.arms) - set(names))
    if unknown:
        raise ValueError(f"trace has arms with no ArmInfo: {', '.join(unknown)}")
    endpoint_arms = endpoint_step_arms(requests, samples, names)
    batch_limit = max(a.max_num_seqs for a in arms) + 1  # one bucket past every table: the tail's k
    counts = step_counts(requests, arms, batch_limit, endpoint_arms)
    tables = _k_tables(arms, batch_limit)
    telemetry = arm_telemetry(requests, arms)
    sampled = {str(a) for a in samples.column("arm").to_pylist()} if samples is not None else set()
    replays = replayed(requests, [a for a in arms if a.name not in sampled], batch_limit)
    results = []
    for i, arm in enumerate(arms):
        endpoint = arm.name in sampled
        extra = (
            endpoint_findings(
                requests, arm, samples, counts.steps_without_batch.get(arm.name, 0),
                steps_from_drafts=arm.name in endpoint_arms, dialect=dialect,
            )
            if endpoint and samples is not None
            else [floor0_finding(requests, arm)] if arm.facts.floor0 else []
        )  # fmt: skip
        result = _verify_arm(
            arm, counts.histogram[i], tables[i], telemetry[i], bands, settings, counts.mismatched_requests,
            counts.steps_without_k.get(arm.name, 0),
            steps_skipped_drafts=counts.steps_skipped_drafts.get(arm.name, 0), endpoint=endpoint, extra=extra,
            replay=replays.get(arm.name),
        )  # fmt: skip
        results.append(without_steps(result, dialect) if endpoint and dialect.steps == "none" else result)
    # A schedule of one k at every batch size has no switch to time (whether that k ran is executed_k's check);
    # SGLang's slots switch by their rule whatever k each starts at
    switching = [a for a in arms if a.facts.switches_with_load and (a.rule is not None or one_k(a) is None)]
    # An endpoint whose server shows no step's draft length has no steps to time: said, never silently absent
    blind = [a for a in switching if a.name in sampled and dialect.steps == "none"]
    timed = [a for a in switching if a not in blind]
    timings = (
        switch_timings(
            binned_step_runs(requests, timed, shapes, settings), timed, shapes, bound_s=settings.switch_bound_s
        )
        if shapes and timed
        else []
    )
    if shapes and blind:
        reason = "; ".join(n for n in (dialect.steps_note, dialect.gauge_note) if n)
        timings += unverifiable_timings(
            [key for _, key in run_ids(requests)], blind, shapes, reason, bound_s=settings.switch_bound_s
        )
    return VerificationReport(
        arms=results, switch_timings=timings, passed=all(r.passed for r in results) and all(t.passed for t in timings)
    )
