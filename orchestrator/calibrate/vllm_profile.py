"""vLLM's offline profile for dynamic speculation (vLLM PR #32374's DynamicSpeculativeConfig, saved as JSON):

    {"max_num_speculative_tokens": 7, "acceptance_rate_per_pos": [0.68, 0.39, ...],
     "batch_stats": {"1": {"0": 6.87, "1": 7.97, ...}, "16": {...}}}

batch_stats[batch][k] is the inter-token latency in milliseconds the profiler measured at that batch size and
k (one output chunk per step, so a step's time); acceptance_rate_per_pos[i] is the share of drafts whose
position i was accepted (vLLM's per-position rate: unconditional), so position i's conditional acceptance is
rate[i] / rate[i-1]. The profiler ran prompts of one length the file does not record: `context_tokens` (the mean
KV tokens per request in its run) turns per-request costs into per-KV-token ones. k = 0 is read as speculation
off (the verify pass alone), so the drafter's idle cost is not in the file.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.analysis.steps.stepfit import COEFFICIENTS, StepData, design, huber_fit, unidentified
from orchestrator.calibrate.acceptance import CategoryFit
from orchestrator.calibrate.json_input import read_json_file
from orchestrator.calibrate.writer import fitted_profile, now_iso
from serve_apps.sim.profile import Profile, Provenance


class VllmProfileError(ValueError):
    pass


class VllmDynamicProfile(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    max_num_speculative_tokens: int = Field(ge=1)
    acceptance_rate_per_pos: list[float] = Field(min_length=1)
    batch_stats: dict[int, dict[int, float]] = Field(min_length=1)


def read_vllm_profile(path: str) -> VllmDynamicProfile:
    data = read_json_file(path, VllmProfileError)
    try:
        return VllmDynamicProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise VllmProfileError(f"{path}: {where}: {first['msg']} (not vLLM's dynamic speculation profile)") from None


def conditional_acceptance(rates: list[float]) -> list[float]:
    out, previous = [], 1.0
    for r in rates:
        out.append(min(1.0, r / previous) if previous > 0 else 0.0)
        previous = r
    return out


def clamped_acceptance(rates: list[float]) -> list[str]:
    """A note (printed by calibrate) for each position whose conditional acceptance conditional_acceptance clamps
    to 1: a rate above 1, or above the position before it, is not a probability of acceptance as written."""
    notes, previous = [], 1.0
    for i, r in enumerate(rates):
        if previous > 0 and r > previous:
            before = "1 (a probability)" if i == 0 else f"position {i - 1}'s {previous:g}"
            notes.append(f"warning: acceptance_rate_per_pos[{i}] = {r:g} is above {before}: its conditional "
                         f"acceptance {r / previous:.3g} clamped to 1")  # fmt: skip
        previous = r
    return notes


def profile_from_vllm(
    path: str, base: Profile, *, name: str, context_tokens: int, categories: list[str]
) -> Profile:
    stats = read_vllm_profile(path)
    rows = [(b, k, ms / 1e3) for b, by_k in stats.batch_stats.items() for k, ms in by_k.items()]
    batch, k, seconds = (np.asarray(c, dtype=float) for c in zip(*rows, strict=True))
    data = StepData(seconds=seconds, kv=batch * context_tokens, batched=batch * (k + 1), k=k, batch=batch,
                    speculative=k > 0)  # fmt: skip
    x = design(data)
    missing = {COEFFICIENTS[j] for j in unidentified(x)} - {"draft.idle_fixed", "draft.idle_per_request"}
    if missing:
        raise VllmProfileError(f"{path}: batch_stats cannot separate {', '.join(sorted(missing))} "
                               "(needs two batch sizes and two k > 0 besides k = 0)")  # fmt: skip
    columns = [j for j, c in enumerate(COEFFICIENTS) if c not in {"draft.idle_fixed", "draft.idle_per_request"}]
    fit = huber_fit(x, seconds, columns)
    per_position = conditional_acceptance(stats.acceptance_rate_per_pos)
    acceptance = [CategoryFit(c, per_position, per_position, per_position, [], from_lists=True) for c in categories]
    notes = [
        f"from vLLM's dynamic speculation profile {path} ({len(rows)} batch x k points, {context_tokens} KV "
        "tokens per request assumed)",
        "verify.fixed + step_overhead fitted as one per-step constant (written as verify.fixed)",
        "draft.idle_* not in the file (k = 0 read as speculation off): written as 0",
        f"one acceptance vector for {', '.join(categories)}",
        *(f"{c} fitted below 0: held at 0" for c in fit.held_at_zero),
        *clamped_acceptance(stats.acceptance_rate_per_pos),
    ]
    provenance = Provenance(source="vllm-profile", runs=[path], steps=len(rows), fitted=now_iso(), notes=notes)
    return fitted_profile(base, name=name, fit=fit, acceptance=acceptance, k_switch_cost_s=0.0,
                          provenance=provenance)  # fmt: skip
