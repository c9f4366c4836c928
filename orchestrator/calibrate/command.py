"""`specdrill calibrate`: read the runs, refuse what cannot be fitted (one line, the reason), fit, say how well."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.analysis.read.inputs import RunInputs, load_run
from orchestrator.analysis.read.time_scale import engine_time_scale
from orchestrator.analysis.read.views import run_requests
from orchestrator.analysis.steps.arm_steps import ArmSteps, arm_steps
from orchestrator.analysis.steps.kswitch import describe
from orchestrator.analysis.steps.step_model import ArmReport, CalibrationError, StepFit, fit_steps
from orchestrator.analysis.steps.stepfit import COEFFICIENTS, Fit
from orchestrator.calibrate.acceptance import CategoryFit, fit_acceptance
from orchestrator.calibrate.engines import compare_engines
from orchestrator.calibrate.predict import PredictionCheck, predict
from orchestrator.calibrate.writer import fitted_profile, now_iso, write_profile
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.policies import DynamicPolicy, FixedPolicy, OffPolicy
from serve_apps.sim.profile import Profile, Provenance, load_profile


@dataclass(frozen=True)
class Calibration:
    profile: Profile
    fit: Fit | None
    arms: list[ArmReport]
    acceptance: list[CategoryFit]
    lines: list[str]  # what the command prints, one claim a line
    # Where the runs' engines differ beyond their fits' intervals: one profile per run (run id -> profile), and
    # `profile` is not to be written; empty where one pooled fit speaks for every run.
    separate: dict[str, Profile] = field(default_factory=dict)
    checks: list[PredictionCheck] = field(default_factory=list)


def _acceptance(inputs: Sequence[RunInputs], repeats: Collection[int] | None) -> list[CategoryFit]:
    speculative_arms = [a.name for r in inputs for a in r.campaign.arms() if not isinstance(a.policy, OffPolicy)]
    max_k = max((a.policy.resolve().num_speculative_tokens for r in inputs for a in r.campaign.arms()), default=0)
    if not speculative_arms or max_k == 0:
        raise CalibrationError("no speculative arm (only off): no draft cost or acceptance to fit")
    # An arm that does not sample as vLLM's standard rejection sampler (synthetic rates, fly, block) measures no
    # acceptance of the models: its steps still fit the cost, its acceptance is left out (_acceptance_notes).
    other = _not_standard(inputs)
    speculative_arms = [name for name in speculative_arms if name not in other]
    if not speculative_arms:
        return []  # the base profile's acceptance is kept
    acceptance: list[CategoryFit] = []
    for run in inputs:
        fixed_k = {a.name: a.policy.k for a in run.campaign.arms()
                   if isinstance(a.policy, FixedPolicy) and a.name not in other}  # fmt: skip
        units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in run.units
                 if repeats is None or u.unit.repeat in repeats]  # fmt: skip
        requests = run_requests(run.store.root, units)
        try:
            acceptance.extend(fit_acceptance(requests.con, speculative_arms, max_k=max_k, fixed_k=fixed_k))
        finally:
            requests.close()
    return acceptance


def _base_profile(inputs: Sequence[RunInputs], base: str | None) -> Profile:
    if base is not None:
        return load_profile(base)
    campaign = inputs[0].campaign
    engine = campaign.engine
    kind = kind_of(engine)
    simulation = kind.simulation(engine)
    if simulation is not None:
        return simulation.profile
    shipped = load_profile("llama3.1-8b-h100-eagle")
    # The limits and names that a replay of the run must share with it: its engine's, not the shipped H100's.
    update: dict[str, object] = {"hardware": f"the hardware of run {inputs[0].manifest['run']}"}
    model = kind.loaded_model(engine)
    if model is not None:
        update["model"] = model
        update["limits"] = shipped.limits.model_copy(update={"max_num_seqs": campaign.max_num_seqs()})
    # vLLM's methods name the profile's drafter; another engine's design names its own (not a vLLM method)
    drafters = [a.policy for a in campaign.arms() if isinstance(a.policy, FixedPolicy | DynamicPolicy)]
    if drafters:
        update["drafter_method"] = drafters[0].method
        update["drafter_model"] = drafters[0].model
    return shipped.model_copy(update=update)


def _profile_of(inputs: Sequence[RunInputs], base: str | None, name: str, fitted: StepFit | None,
                acceptance: list[CategoryFit], notes: list[str]) -> Profile:  # fmt: skip
    base_profile = _base_profile(inputs, base)
    provenance = Provenance(
        source="timelines",
        runs=[str(r.manifest["run"]) for r in inputs],
        arms=sorted({a.arm for r in inputs for a in (u.unit for u in r.units)}),
        steps=fitted.fit.steps if fitted else 0,
        fitted=now_iso(),
        notes=notes,
    )
    return fitted_profile(base_profile, name=name, fit=fitted.fit if fitted else None, acceptance=acceptance,
                          k_switch_cost_s=fitted.k_switch_cost_s if fitted else 0.0, provenance=provenance,
                          step_overhead_s=fitted.step_gap_s if fitted else 0.0,
                          max_draft_tokens=measured_k(acceptance))  # fmt: skip


def _check(inputs: Sequence[RunInputs], profile: Profile, repeats: Collection[int] | None) -> list[PredictionCheck]:
    with tempfile.TemporaryDirectory(prefix="specdrill-calibrate-") as scratch:
        path = str(Path(scratch) / f"{profile.name}.yaml")
        write_profile(profile, path)
        return [predict(run, path, fitted_repeats=repeats) for run in inputs]


def calibrate(
    run_dirs: Sequence[str],
    *,
    name: str,
    base: str | None = None,
    repeats: Collection[int] | None = None,
    check: bool = True,
) -> Calibration:
    """`repeats`: fit on these repeats only; the prediction check then compares the others (held out)."""
    inputs = [load_run(d) for d in run_dirs]
    lines: list[str] = []
    steps: dict[str, ArmSteps] = {}
    per_run: dict[str, dict[str, ArmSteps]] = {}
    for run in inputs:
        found = hardware_seconds(arm_steps(run, repeats=repeats), engine_time_scale(run.campaign))
        run_id = str(run.manifest["run"])
        if not found:
            lines.append(f"{run_id}: no engine step timeline (endpoint arms): fitting acceptance only")
        for arm, s in found.items():
            if s.missing:
                raise CalibrationError(f"{run_id}: arm {arm}: {s.missing}: cannot fit its step times")
            key = arm if len(inputs) == 1 else f"{run_id}/{arm}"
            steps[key] = s
            per_run.setdefault(run_id, {})[key] = s
    acceptance = _acceptance(inputs, repeats)
    separate: dict[str, Profile] = {}
    fits: dict[str, StepFit] = {}
    if len(per_run) > 1:
        try:
            fits = {run_id: fit_steps(group) for run_id, group in per_run.items()}
        except CalibrationError as exc:  # the runs together may identify what one alone does not
            lines.append(f"one run alone cannot be fitted ({exc}): one pooled fit, engines not compared")
    if fits:
        verdict = compare_engines({run_id: f.fit for run_id, f in fits.items()})
        lines.extend(verdict.lines)
        if verdict.differ:
            for run in inputs:
                run_id = str(run.manifest["run"])
                own = fits.get(run_id)
                mine = _acceptance([run], repeats)
                notes = [
                    *(own.notes if own else []),
                    "fitted alone: the runs' engines differ beyond their intervals",
                    *_acceptance_notes([run], mine),
                    *limit_notes(_base_profile([run], base), mine),
                ]
                separate[run_id] = _profile_of([run], base, f"{name}.{run_id}", own, mine, notes)
                lines.append(f"run {run_id}:")
                lines.extend(render(own.fit if own else None, own.arms if own else [], mine, notes))
    pooled = fit_steps(steps) if steps and not separate else None
    notes = [*(pooled.notes if pooled else []), *(n for r in inputs for n in time_scale_lines(r))]
    notes.extend(_acceptance_notes(inputs, acceptance))
    notes.extend(limit_notes(_base_profile(inputs, base), acceptance))
    profile = _profile_of(inputs, base, name, pooled, acceptance, notes)
    if not separate:
        lines.extend(render(pooled.fit if pooled else None, pooled.arms if pooled else [], acceptance, notes))
    checks: list[PredictionCheck] = []
    if check and steps:
        if separate:
            for run in inputs:
                checks.extend(_check([run], separate[str(run.manifest["run"])], repeats))
        else:
            checks = _check(inputs, profile, repeats)
        for c in checks:
            lines.extend(c.lines())
    return Calibration(profile=profile, fit=pooled.fit if pooled else None, arms=pooled.arms if pooled else [],
                       acceptance=acceptance, lines=lines, separate=separate, checks=checks)  # fmt: skip


def measured_k(acceptance: list[CategoryFit]) -> int | None:
    """The longest draft the acceptance was measured at: the fitted profile's draft limit (None: none fitted)."""
    return max((a.measured_k for a in acceptance), default=0) or None


def limit_notes(base: Profile, acceptance: list[CategoryFit]) -> list[str]:
    measured, limit = measured_k(acceptance), base.limits.max_draft_tokens
    if measured is None or (limit is not None and limit <= measured):
        return []
    return [f"limits.max_draft_tokens {measured} (the base's: {limit or 'none'}): acceptance was measured up to "
            f"k = {measured}, and past it a profile repeats its last position, which nothing measured: campaigns, "
            f"`simulate oracle` and `tune` on this profile stop at k = {measured}"]  # fmt: skip


def hardware_seconds(steps: dict[str, ArmSteps], scale: float) -> dict[str, ArmSteps]:
    """A simulated engine at time_scale s takes s times its profile's time per step (and between steps): divided by
    s, the fit is in the modelled hardware's own seconds, which the profile's `hardware` names."""
    if scale == 1.0:
        return steps
    return {arm: dataclasses.replace(s, seconds=s.seconds / scale, gap=s.gap / scale) for arm, s in steps.items()}


def time_scale_lines(run: RunInputs) -> list[str]:
    scale = engine_time_scale(run.campaign)
    if scale == 1.0:
        return []
    return [f"run {run.manifest['run']}: engine.time_scale {scale:g}: its steps took {scale:g}x the hardware's time; "
            f"divided by {scale:g}, the costs are the modelled hardware's own seconds"]  # fmt: skip


def _not_standard(inputs: Sequence[RunInputs]) -> set[str]:
    return {a.name for r in inputs for a in r.campaign.arms()
            if getattr(a.policy, "rejection_sample_method", "standard") != "standard"}  # fmt: skip


def _acceptance_notes(inputs: Sequence[RunInputs], acceptance: list[CategoryFit]) -> list[str]:
    other = sorted(_not_standard(inputs))
    left_out = [f"acceptance: arms {', '.join(other)} left out (synthetic, fly or block rejection sampling: not the "
                "models' own acceptance; their steps fit the cost)" + ("; no arm left: the base profile's "
                "acceptance kept" if not acceptance else "")] if other else []  # fmt: skip
    totals = [a for a in acceptance if not a.from_lists]
    if not totals:
        return left_out
    notes = ["acceptance from per-request totals (no per-step lists): " + ("per position from the fixed-k arms' "
             "mean accepted per verify step at each k (95% bootstrap intervals over requests)" if any(a.basis for a in
             totals) else "one p for every position")]  # fmt: skip
    notes = [*left_out, *notes]
    dynamic = sorted({a.name for r in inputs for a in r.campaign.arms() if isinstance(a.policy, DynamicPolicy)})
    if dynamic and any(a.basis for a in totals):
        notes.append(f"acceptance: dynamic arms {', '.join(dynamic)} left out (their requests' totals mix k from "
                     "step to step, and without per-step lists no step's k can be attributed)")  # fmt: skip
    notes.extend(f"acceptance {a.how}" for a in totals if a.how)
    return notes


def render(fit: Fit | None, arms: list[ArmReport], acceptance: list[CategoryFit], notes: list[str]) -> list[str]:
    out = []
    if fit is not None:
        out.append(f"step-time model, Huber fit over {fit.steps} steps:")
        out.extend(f"  {name} = {value:.4g} s" for name, value, ok in zip(COEFFICIENTS, fit.coef, fit.fitted,
                                                                         strict=True) if ok)  # fmt: skip
    for a in arms:
        q = a.quality
        out.append(
            f"arm {a.arm}: {q.steps} steps, R^2 {q.r2:.3f}, step time p50 {q.error_p50:+.1%}, p95 {q.error_p95:+.1%}"
            f" (median per-step error {q.per_step_error_p50:.1%})"
        )
        if a.k_switch is not None:
            s = a.k_switch
            out.append(f"arm {a.arm}: {describe(s)}")
    for c in acceptance:
        basis = c.basis or [""] * len(c.per_position)
        positions = ", ".join(f"{p:.3f} [{lo:.3f}, {hi:.3f}]{' ' + b if b else ''}"
                              for p, lo, hi, b in zip(c.per_position, c.low, c.high, basis, strict=True))  # fmt: skip
        if c.from_lists:
            how = "per position"
        elif c.basis:
            how = "per position from the fixed-k arms' per-request totals"
            positions += f"; past position {len(c.basis)}: extrapolated (position {len(c.basis)}'s value)"
        else:
            how = "one p for all positions (per-request totals)"
        out.append(f"acceptance {c.category}, {how}: {positions}")
    out.extend(f"note: {n}" for n in notes)
    return out
