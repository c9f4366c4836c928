"""What the rest of specdrill needs to know about each kind of speculation policy, told in one place.

Three engines' designs run as arms side by side (vLLM's `off`, `fixed`, `dynamic`; SGLang's `sglang_adaptive`;
TensorRT-LLM's `trtllm_schedule`, `trtllm_max_concurrency`, `trtllm_acceptance_gate`). A place that must treat
them differently asks `facts(kind)` (how the verifier checks what an arm executed, whether its k moves with load,
whose bug it may show) or the helpers below, never the kind's name: tests/test_policy_kind_tests.py fails on the
other engines' kinds compared by name or class outside the policy modules and this one, as
tests/test_kind_tests.py does for engine kinds. Every policy answers `max_k`, `label` and `resolve` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from serve_apps.policies import AnyPolicy, DynamicPolicy, FixedPolicy, OffPolicy, PolicyError, Topology

# How the executed-policy check knows the k each step should have run: `table` (a k per batch size: vLLM's
# schedule, fixed, off, TensorRT-LLM's schedule and concurrency cap), `sglang` (SGLang's rule replayed on the
# recorded steps: its slot, EMA and hysteresis), `gate` (TensorRT-LLM's acceptance gate replayed on the steps).
Check = Literal["table", "sglang", "gate"]
Engine = Literal["vLLM", "SGLang", "TensorRT-LLM"]
PolicyKindName = Literal[
    "off", "fixed", "dynamic", "sglang_adaptive", "trtllm_schedule", "trtllm_max_concurrency", "trtllm_acceptance_gate"
]


@dataclass(frozen=True)
class PolicyKind:
    name: PolicyKindName
    engine: Engine  # whose design it is
    speculative: bool  # drafts at all (off: no)
    check: Check
    adaptive: bool  # its k changes from step to step (a schedule, a rule): the rule-following checks apply
    switches_with_load: bool  # its k follows the batch size: a load crossing has a switch to time
    schedule_in_config: bool  # the engine's resolved config carries its batch-size table (vLLM's form)
    floor0: bool  # a k = 0 step may leave the drafter stale (TensorRT-LLM's one-model path, bug #16888)
    fallback: str | None  # whose topology fallback drops it to a static k, in the words of the findings

    @property
    def runs_on_vllm(self) -> bool:
        return self.engine == "vLLM"


POLICY_KINDS: dict[str, PolicyKind] = {
    k.name: k
    for k in (
        PolicyKind("off", "vLLM", speculative=False, check="table", adaptive=False, switches_with_load=False,
                   schedule_in_config=False, floor0=False, fallback=None),
        PolicyKind("fixed", "vLLM", speculative=True, check="table", adaptive=False, switches_with_load=False,
                   schedule_in_config=False, floor0=False, fallback=None),
        PolicyKind("dynamic", "vLLM", speculative=True, check="table", adaptive=True, switches_with_load=True,
                   schedule_in_config=True, floor0=False, fallback="vLLM's data-parallel fallback"),
        PolicyKind("sglang_adaptive", "SGLang", speculative=True, check="sglang", adaptive=True,
                   switches_with_load=True, schedule_in_config=False, floor0=False,
                   fallback="SGLang's attention-DP fallback"),
        PolicyKind("trtllm_schedule", "TensorRT-LLM", speculative=True, check="table", adaptive=True,
                   switches_with_load=True, schedule_in_config=True, floor0=True, fallback=None),
        PolicyKind("trtllm_max_concurrency", "TensorRT-LLM", speculative=True, check="table", adaptive=True,
                   switches_with_load=True, schedule_in_config=True, floor0=True, fallback=None),
        # The gate reacts to acceptance, not to load: no crossing to time. Once shut it stays shut, so no request
        # drafts after its k = 0 step again: the floor-0 fault has nothing to spoil.
        PolicyKind("trtllm_acceptance_gate", "TensorRT-LLM", speculative=True, check="gate", adaptive=True,
                   switches_with_load=False, schedule_in_config=False, floor0=False, fallback=None),
    )
}  # fmt: skip


def facts(kind: str) -> PolicyKind:
    try:
        return POLICY_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown policy kind {kind!r}: expected one of {', '.join(POLICY_KINDS)}") from None


def vllm_policy(policy: AnyPolicy) -> OffPolicy | FixedPolicy | DynamicPolicy:
    """The policy as vLLM takes it; a policy of another engine's design is refused (vLLM cannot run it)."""
    if isinstance(policy, OffPolicy | FixedPolicy | DynamicPolicy):
        return policy
    raise PolicyError(
        f"policy {policy.label} is {facts(policy.kind).engine}'s design: vLLM cannot run it (the simulated "
        "engine runs it; an endpoint of that engine serves it)"
    )


def engine_config(policy: AnyPolicy) -> dict[str, Any] | None:
    """The configuration the arm's engine is given, in its engine's terms (vLLM's speculative_config, SGLang's
    server arguments, TensorRT-LLM's speculative_config); None: no speculation."""
    if isinstance(policy, OffPolicy | FixedPolicy | DynamicPolicy):
        return policy.to_vllm_speculative_config()
    return policy.to_engine_config()


def fallback_k(policy: AnyPolicy) -> int:
    """The static k the design falls back to under data parallelism (vLLM: max k; SGLang: num_steps)."""
    return policy.resolve(Topology(kind="data_parallel", size=2)).num_speculative_tokens
