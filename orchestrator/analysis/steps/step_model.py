"""The step-time model fitted over arms' steps: refused in one line where the data cannot identify a coefficient,
and per arm its quality and (dynamic arms) the k-switch cost against the fit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.analysis.steps.arm_steps import ArmSteps
from orchestrator.analysis.steps.kswitch import KSwitch, after_switch, k_switch_cost
from orchestrator.analysis.steps.stepfit import (
    COEFFICIENTS,
    Fit,
    Quality,
    StepData,
    design,
    huber_fit,
    quality,
    unidentified,
)

PER_STEP = 2  # index of verify.fixed + step_overhead: fitted as one by design, never a refusal
_WHY = {
    "draft.per_kv_token": "no speculative arm (only off): the draft cost",
    "draft.fixed": "no step drafted (no speculative step with k > 0): the draft cost",
    "draft.per_draft_token": "one k only: the draft cost per token cannot be told from its per-step cost",
    "verify.per_kv_token": "one context length only: the per-KV-token cost",
    "verify.per_batched_token": "one batch size only: per-token costs cannot be told from per-step ones",
}
# Coefficients a run may leave unfitted without being refused (written as 0, and said so).
SMEAR_TOLERANCE = 1e-3  # a noiseless engine (the simulator) averages x1.000: its fit is written as fitted
_OPTIONAL = {"draft.idle_fixed", "draft.idle_per_request"}


class CalibrationError(ValueError):
    """A run that cannot identify a coefficient, or cannot be read: one line."""


@dataclass(frozen=True)
class ArmReport:
    arm: str
    quality: Quality
    k_switch: KSwitch | None


@dataclass(frozen=True)
class StepFit:
    fit: Fit
    arms: list[ArmReport]
    k_switch_cost_s: float
    notes: list[str]
    # The engine's own time between busy steps, outside each step's timing (vLLM: the scheduler's bookkeeping,
    # the IPC hop, detokenising); 0 where the steps are back to back (the simulated engine times it inside).
    step_gap_s: float
    gaps: int


def _usable(s: ArmSteps) -> np.ndarray:
    """Steps with a duration, batched and KV tokens, and (speculative arms) a known k."""
    known_k = ~np.isnan(s.k) | (not s.speculative)
    return np.asarray((s.seconds > 0) & ~np.isnan(s.batched) & ~np.isnan(s.kv) & known_k, dtype=bool)


def _pooled(steps: list[ArmSteps]) -> tuple[StepData, np.ndarray]:
    """The usable steps, and per step whether it is near a k switch."""
    parts, near = [], []
    for s in steps:
        ok = _usable(s)
        k = np.where(np.isnan(s.k), 0.0, s.k) if not s.speculative else s.k
        parts.append((s.seconds[ok], s.kv[ok], s.batched[ok], k[ok], s.batch[ok], np.full(ok.sum(), s.speculative)))
        near.append(after_switch(s.k, s.previous_k())[ok])
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    return StepData(*cols), np.concatenate(near)


def fit_steps(steps: dict[str, ArmSteps]) -> StepFit:
    """The step-time model over these arms' steps (refused, one line, where a coefficient is not identified)."""
    data, near = _pooled(list(steps.values()))
    if not len(data.seconds):
        raise CalibrationError("no step with a duration, batched and KV tokens and a known k: nothing to fit")
    fit_rows = ~near  # steps next to a k switch are the switch cost's evidence, not the model's
    # The fitted rows' design and times, taken once: every step of the run is in them (the report fits a run's
    # steps), and each copy of the design is 64 bytes a step.
    x, seconds = design(data)[fit_rows], data.seconds[fit_rows]
    missing = [COEFFICIENTS[j] for j in unidentified(x) if j != PER_STEP]
    refused = [c for c in missing if c not in _OPTIONAL]
    if refused:
        why = _WHY.get(refused[0], refused[0])
        raise CalibrationError(f"cannot fit {why} ({', '.join(refused)} not identified)")
    columns = [j for j in range(x.shape[1]) if COEFFICIENTS[j] not in missing]
    fit = huber_fit(x, seconds, columns)
    # Huber follows the typical step; a loaded host's stalls lengthen some steps, and a request's TPOT pays
    # every one: the mean ratio of measured to fitted (Duan's smearing) scales the costs back to the mean step.
    fitted_s = fit.predict(x)
    del x
    positive = fitted_s > 0
    smear = float(np.mean(seconds[positive] / fitted_s[positive])) if positive.any() else 1.0
    if abs(smear - 1.0) > SMEAR_TOLERANCE:
        fit = fit.scaled(smear)
    notes = [f"{c} not identified (no speculative step with k = 0): written as 0" for c in missing]
    if abs(smear - 1.0) > SMEAR_TOLERANCE:
        notes.append(f"steps average x{smear:.3f} the robust fit's typical step (host stalls): costs scaled by it")
    notes.extend(f"{c} fitted below 0: held at 0" for c in fit.held_at_zero)
    gap_s, gaps = busy_gap(list(steps.values()))
    notes.append("verify.fixed + step_overhead fitted as one per-step constant (written as verify.fixed)")
    if gap_s > 0:
        notes.append(
            f"step_overhead written as the mean gap between busy steps, {gap_s * 1e3:.3f} ms over {gaps} gaps: "
            "time the engine spends outside its steps' own timing"
        )
    arm_reports = []
    for key, s in steps.items():
        mine = _pooled([s])[0]
        predicted = fit.predict(design(mine))
        ok = _usable(s)
        switch = k_switch_cost(mine.seconds - predicted, s.k[ok], s.previous_k()[ok]) if s.dynamic else None
        arm_reports.append(ArmReport(key, quality(mine.seconds, predicted), switch))
    switches = [r.k_switch for r in arm_reports if r.k_switch is not None]
    total = sum(k.switches for k in switches)
    k_cost = sum(k.excess_s * k.switches for k in switches) / total if total else 0.0
    return StepFit(fit, arm_reports, k_cost, notes, gap_s, gaps)


def busy_gap(steps: list[ArmSteps]) -> tuple[float, int]:
    """The mean gap before a step that decodes requests the previous step ran (the engine never idled), and how
    many. The mean, not a robust centre: a request's TPOT sums every gap, the host's long stalls included."""
    gaps = np.concatenate([s.gap[s.busy] for s in steps]) if steps else np.array([])
    if not len(gaps):
        return 0.0, 0
    return max(0.0, float(gaps.mean())), len(gaps)
