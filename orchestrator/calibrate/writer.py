"""A fitted profile: the base profile's limits and names, the fitted costs and acceptance, its provenance."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml

from orchestrator.analysis.steps.stepfit import Fit
from orchestrator.calibrate.acceptance import CategoryFit
from serve_apps.sim.profile import CategoryAcceptance, DraftCost, Profile, Provenance, VerifyCost


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fitted_profile(
    base: Profile,
    *,
    name: str,
    fit: Fit | None,
    acceptance: list[CategoryFit],
    k_switch_cost_s: float,
    provenance: Provenance,
    step_overhead_s: float = 0.0,
    max_draft_tokens: int | None = None,
) -> Profile:
    """`fit` None: costs stay the base's (acceptance only). The per-step constant inside a step is written as
    verify.fixed; `step_overhead_s` is the time between busy steps, outside them. `max_draft_tokens`: the largest k
    the acceptance was measured at, written as the limit (lowering the base's) so that nothing run on the profile
    drafts past the positions it measured."""
    verify, draft, overhead = base.verify, base.draft, base.step_overhead
    if fit is not None:
        c = [float(v) for v in fit.coef]
        verify = VerifyCost(per_kv_token=c[0], per_batched_token=c[1], fixed=c[2])
        overhead = step_overhead_s
        draft = DraftCost(
            kind="model", per_kv_token=c[3], per_draft_token=c[4], fixed=c[5], idle_fixed=c[6],
            idle_per_request=c[7],
        )  # fmt: skip
    accept = dict(base.acceptance)
    for a in acceptance:
        accept[a.category] = CategoryAcceptance(per_position=[float(p) for p in a.per_position])
    return Profile(
        name=name,
        description=f"fitted by specdrill calibrate from {', '.join(provenance.runs)}",
        hardware=base.hardware,
        model=base.model,
        drafter_method=base.drafter_method,
        drafter_model=base.drafter_model,
        verify=verify,
        draft=draft,
        step_overhead=overhead,
        k_switch_cost_s=max(0.0, k_switch_cost_s),
        limits=base.limits
        if max_draft_tokens is None
        else base.limits.model_copy(
            update={"max_draft_tokens": min(max_draft_tokens, base.limits.max_draft_tokens or max_draft_tokens)}
        ),
        acceptance=accept,
        # A category the run measured now has its own acceptance; the rest keep falling back as in the base.
        category_map=base.category_map,
        default_category=base.default_category,
        calibration_notes="; ".join(provenance.notes),
        provenance=provenance,
    )


def write_profile(profile: Profile, path: str) -> None:
    text = yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False)
    target = Path(path)
    temporary = target.with_name(f".tmp-{target.name}")
    temporary.write_text(text)
    temporary.replace(target)
