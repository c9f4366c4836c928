"""The campaign's gates (campaign.gates) judged on the verification and the units: one GateResult each, an
exempt arm's failure reported and not failed."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.opmap.results import UNPROVEN, ArmVerification, VerificationReport
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.plan.campaign import Campaign, GateConfig
from orchestrator.rundir.layout import UnitResult


class GateResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    gate: str
    arm: str | None
    passed: bool
    message: str
    exempt: bool = False  # it failed on an arm of gates.exempt_arms: reported, and `passed` (it fails nothing)


def engine_lagged(units: list[UnitResult]) -> list[str]:
    """One line per unit whose simulated engine lagged behind its step schedule: its latencies are the host's."""
    return [
        f"{u.unit.key}: engine lag added {u.engine_lag_share or 0.0:.0%} to the model's step time (bound "
        f"{u.engine_lag_bound or 0.0:.0%}; p99 lag {(u.engine_lag_p99_s or 0.0) * 1e3:.1f} ms)"
        for u in units
        if u.engine_lagged
    ]


def evaluate_gates(
    campaign: Campaign, arms: list[ArmInfo], verification: VerificationReport, units: list[UnitResult]
) -> list[GateResult]:
    gates = campaign.gates
    results: list[GateResult] = []
    by_name = {a.arm: a for a in verification.arms}
    for arm in arms:
        checked = by_name.get(arm.name)
        if checked is None:
            continue
        exempt = arm.name in gates.exempt_arms
        if gates.baseline_is_off and arm.kind == "off":
            results.extend(_baseline_gate(arm.name, checked, arms, exempt))
        if gates.dynamic_follows_schedule and arm.facts.adaptive:  # vLLM's schedule and the other engines' designs
            results.append(_follows_schedule_gate(gates, arm.name, checked, exempt, rule=arm.facts.check != "table"))
        if gates.fail_on_schedule_dropped:
            dropped = [
                f for f in checked.findings
                if "dropped" in f.check and (f.failed or (not f.verifiable and gates.not_verifiable == "fail"))
            ]  # fmt: skip
            results.append(
                GateResult(
                    gate="schedule_dropped", arm=arm.name, passed=not dropped or exempt,
                    exempt=bool(dropped) and exempt,
                    message=dropped[0].message + _EXEMPT * exempt if dropped else f"{arm.name}: schedule not dropped",
                )
            )  # fmt: skip
    if gates.max_recovery_s is not None:
        for timing in verification.switch_timings:
            # A switch the load never asked for, or one the server's telemetry cannot show, fails only where checks
            # without evidence do (gates.not_verifiable)
            held = timing.passed or (timing.status in UNPROVEN and gates.not_verifiable != "fail")
            exempt = not held and timing.arm in gates.exempt_arms
            results.append(
                GateResult(
                    gate="recovery", arm=timing.arm, passed=held or exempt, exempt=exempt,
                    message=timing.message + _EXEMPT * exempt,
                )
            )  # fmt: skip
    if gates.fail_on_saturated_generator:
        for unit in units:
            if unit.saturated:
                capped = sum(w.waited_at_connection_cap for w in unit.workers)
                at_cap = f"; {capped} requests waited at the max_in_flight connection cap" if capped else ""
                results.append(
                    GateResult(
                        gate="generator_saturated", arm=unit.unit.arm, passed=False,
                        message=f"{unit.unit.key}: load generator saturated (p99 send lateness "
                        f"{unit.lateness_p99_s * 1e3:.1f} ms{at_cap})",
                    )
                )  # fmt: skip
    if gates.fail_on_engine_lag:
        for line, unit in zip(engine_lagged(units), [u for u in units if u.engine_lagged], strict=True):
            results.append(
                GateResult(
                    gate="engine_lagged", arm=unit.unit.arm, passed=False,
                    message=f"{line}: the simulated engine fell behind its step schedule (latencies are the host's)",
                )
            )  # fmt: skip
    return results


_EXEMPT = " (exempt: reported, not failed)"


def _baseline_gate(arm: str, checked: ArmVerification, arms: list[ArmInfo], exempt: bool) -> list[GateResult]:
    """An `off` arm shown to have speculated is no baseline: the speedups of every arm compared with it are void."""
    identity = next((f for f in checked.findings if f.check == "identity" and f.failed), None)
    if identity is None:
        return []
    compared = sorted(a.name for a in arms if a.compared_with == arm and a.name != arm)
    against = f" ({', '.join(compared)})" if compared else ""
    message = f"{identity.message}: every speedup measured against {arm}{against} is void"
    return [
        GateResult(gate="baseline_is_off", arm=arm, passed=exempt, exempt=exempt, message=message + _EXEMPT * exempt)
    ]


def _follows_schedule_gate(
    gates: GateConfig, arm: str, checked: ArmVerification, exempt: bool, *, rule: bool = False
) -> GateResult:
    # A check without evidence fails only where the campaign says so (gates.not_verifiable).
    strict = gates.not_verifiable == "fail"
    executed = next((f for f in checked.findings if f.check == "executed_k"), None)
    if executed is not None and not executed.verifiable and _has_finding(checked, "endpoint_approximation"):
        # A foreign server: its steps' batch sizes come from a sampled gauge, so the step-by-step match fraction
        # is the estimate's as much as the engine's. Whether the schedule ran is judged by what holds without the
        # exact batch size: no static max k where the schedule gives less, and k switching across batch sizes.
        judged = [f for f in checked.findings if f.check in ("static_fallback", "schedule_switched")]
        follows = not strict and not checked.failed and len(judged) == 2 and all(f.passed for f in judged)
        basis = (
            "judged by static_fallback and schedule_switched: "
            + "; ".join(f.message for f in judged)
            + " (the step-by-step match is not verifiable: batch sizes from sampled /metrics)"
        )
    else:
        follows = (
            (checked.passed if strict else not checked.failed)
            and checked.match_fraction is not None
            and checked.match_fraction >= gates.min_follow_fraction
        )
        basis = "executed k follows its rule, replayed on its steps" if rule else "executed k follows the schedule"
    # The findings' messages name the arm already (no "dyn-dp2: dyn-dp2:"); the basis does not
    reason = "; ".join(f.message for f in checked.findings if f.failed) or f"{arm}: {basis}"
    unverified = [f.check for f in checked.unverified]
    if unverified:
        reason += f" (not verifiable: {', '.join(unverified)})"
    unexercised = [f.check for f in checked.unexercised]
    if unexercised:
        reason += f" (not exercised: {', '.join(unexercised)})"
    return GateResult(
        gate="dynamic_follows_schedule", arm=arm, passed=follows or exempt, exempt=exempt and not follows,
        message=reason + _EXEMPT * (exempt and not follows),
    )  # fmt: skip


def _has_finding(checked: ArmVerification, check: str) -> bool:
    return any(f.check == check for f in checked.findings)
