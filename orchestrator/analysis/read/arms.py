"""What the analysis needs to know about an arm: its declared policy, as configured, and where it ran."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_apps.policies import (
    SINGLE,
    AnyPolicy,
    DynamicPolicy,
    OffPolicy,
    ScheduleEntry,
    Topology,
    dense_schedule,
    validate_schedule,
)
from serve_apps.policy_kinds import PolicyKind, PolicyKindName, facts, fallback_k
from serve_apps.resolved import GateRule, SglangRule, table_to_schedule
from serve_apps.spec_knobs import knobs_text
from serve_apps.vllm_versions import VllmTarget, cause_of_warning


class ArmInfo(BaseModel):
    """The configured policy, not the resolved one: verification compares what ran against what was asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    kind: PolicyKindName
    k: int = Field(default=0, ge=0)  # the largest k the arm can run: fixed k; max k (vLLM's num_speculative_tokens,
    # SGLang's largest candidate, TensorRT-LLM's max_draft_len); off: 0
    # A design whose k is a table by batch size (vLLM's dynamic; TensorRT-LLM's schedule and concurrency cap,
    # resolved to that form up to max_num_seqs): [start, end, k] as configured
    schedule: tuple[ScheduleEntry, ...] | None = None
    # A design whose k depends on the steps before (SGLang's adaptive steps, TensorRT-LLM's gate): its rule as
    # configured, replayed on the recorded steps by the verifier
    rule: SglangRule | GateRule | None = Field(default=None, discriminator="kind")
    fallback_k: int = Field(default=0, ge=0)  # the static k its topology fallback runs (vLLM: max k; SGLang: steps)
    topology: str = "single"
    data_parallel_size: int = Field(default=1, ge=1)
    max_num_seqs: int = Field(default=512, ge=1)
    baseline: bool = False  # an `off` arm: other arms' speedups are measured against it
    # The baseline this arm is compared with (orchestrator/plan/baselines.py): `off` on its topology, or on one engine
    # with rates per engine (engines_ratio engines against one). None: the campaign's only baseline.
    compared_with: str | None = None
    engines_ratio: float = Field(default=1.0, gt=0)
    method: str | None = None  # the speculative method (an n-gram drafter may propose fewer tokens than k)
    # A drop other than data parallelism's, predicted for the vLLM the run's replicas reported (vLLM 0.33's model
    # runner V1 drop: serve_apps/vllm_versions.py), one line; and the cause the engine's own warning names.
    predicted_drop: str | None = None
    engine_drop_cause: str | None = None
    knobs: str = ""  # the speculation knobs not at vLLM's defaults (serve_apps/spec_knobs.py knobs_text)

    @model_validator(mode="after")
    def _policy_is_whole(self) -> Self:
        if self.kind == "off" and (self.k or self.schedule):
            raise ValueError(f"arm {self.name!r}: an off arm has no k and no schedule")
        if self.kind == "fixed" and (self.k < 1 or self.schedule):
            raise ValueError(f"arm {self.name!r}: a fixed arm has k >= 1 and no schedule")
        if self.facts.schedule_in_config:
            if self.k < 1 or not self.schedule:
                raise ValueError(f"arm {self.name!r}: a {self.kind} arm has max k >= 1 and a schedule")
            validate_schedule(self.schedule)
        if (self.facts.check != "table") != (self.rule is not None):
            raise ValueError(f"arm {self.name!r}: a {self.kind} arm has a rule exactly when its k depends on the past")
        return self

    @property
    def facts(self) -> PolicyKind:
        return facts(self.kind)

    @classmethod
    def from_policy(
        cls,
        name: str,
        policy: AnyPolicy,
        *,
        topology: Topology = SINGLE,
        max_num_seqs: int = 512,
        baseline: bool | None = None,
        compared_with: str | None = None,
        engines_ratio: float = 1.0,
        vllm: VllmTarget | None = None,
        engine_warning: str | None = None,
    ) -> ArmInfo:
        """`vllm`: the vLLM the arm's engines ran (None: not a vLLM run, or unknown); `engine_warning`: the warning
        the engine logged when it dropped the schedule (the run manifest's schedule_dropped_reason)."""
        resolved = policy.resolve(topology, vllm)
        predicted = resolved.dropped_reason if resolved.schedule_dropped and topology.data_parallel_size == 1 else None
        kind = facts(policy.kind)
        schedule = None
        if isinstance(policy, DynamicPolicy):
            schedule = policy.schedule
        elif kind.schedule_in_config:  # TensorRT-LLM's tables, as the engine reads them up to max_num_seqs
            schedule = table_to_schedule(policy.resolve().k_table(max_num_seqs))
        return cls(
            name=name,
            kind=policy.kind,
            k=policy.max_k,
            schedule=schedule,
            rule=policy.resolve().rule if kind.check != "table" else None,
            fallback_k=fallback_k(policy) if kind.fallback else 0,
            topology=topology.label,
            data_parallel_size=topology.data_parallel_size,
            max_num_seqs=max_num_seqs,
            baseline=policy.kind == "off" if baseline is None else baseline,
            compared_with=compared_with,
            engines_ratio=engines_ratio,
            method=None if isinstance(policy, OffPolicy) else policy.resolve().method,
            predicted_drop=predicted,
            engine_drop_cause=cause_of_warning(engine_warning),
            knobs=knobs_text(policy, topology),
        )

    def k_table(self) -> np.ndarray:
        """Configured k for batch sizes 0..max_num_seqs (index 0 unused), clamped to max k as vLLM does."""
        if self.kind == "off":
            return np.zeros(self.max_num_seqs + 1, dtype=np.int64)
        if isinstance(self.rule, SglangRule):
            # What each slot starts at (its steps before any verification moved it): the replay decides the rest.
            # Imported here: the rule module compiles with numba, which an analysis without SGLang arms never needs.
            from serve_apps.sim.rules.sglang_adaptive import compile_rule

            route, ints, _, state = compile_rule(self.rule, self.max_num_seqs)
            start = np.array([ints[s, 1 + int(state[1 + s, 2])] for s in range(ints.shape[0])], dtype=np.int64)
            table: np.ndarray = start[route]
            table[0] = 0
            return table
        if self.facts.check != "table" or self.kind == "fixed" or self.schedule is None:
            table = np.full(self.max_num_seqs + 1, self.k, dtype=np.int64)
            table[0] = 0
            return table
        return np.asarray(dense_schedule(self.schedule, self.max_num_seqs, self.k), dtype=np.int64)

    @property
    def expects_static_fallback(self) -> bool:
        """vLLM drops a dynamic schedule under data parallelism and runs the static max k; SGLang refuses adaptive
        steps under attention DP and runs its static steps."""
        return self.facts.fallback is not None and self.data_parallel_size > 1

    @property
    def drop_cause(self) -> str | None:
        """Why vLLM ran this arm's schedule as the static max k: the engine's own warning first, else the
        prediction (data parallelism, or vLLM 0.33's model runner V1 + method); None: no drop was expected."""
        if self.facts.fallback is None:
            return None
        if self.engine_drop_cause == "model runner V1 + method" or (
            self.engine_drop_cause is None and self.predicted_drop is not None
        ):
            named = " (named by the engine's warning)" if self.engine_drop_cause else ""
            return f"vLLM's model runner V1 fallback for method {self.method}{named}"
        if self.expects_static_fallback or self.engine_drop_cause == "data parallelism":
            named = ", named by the engine's warning" if self.engine_drop_cause else ""
            return f"{self.facts.fallback or 'a data-parallel fallback'} (topology {self.topology}{named})"
        return None


def baselines_of(arms: Sequence[ArmInfo]) -> dict[str, ArmInfo | None]:
    """The baseline arm of every arm (a baseline is its own): the one it names, else the only baseline there is.
    None where that baseline has no data here (its units did not complete): no speedup can be measured."""
    chosen = {a.name: a for a in arms if a.baseline}
    found: dict[str, ArmInfo | None] = {}
    for arm in arms:
        if arm.baseline:
            found[arm.name] = arm
        elif arm.compared_with is not None:
            found[arm.name] = chosen.get(arm.compared_with)
        elif len(chosen) <= 1:
            found[arm.name] = next(iter(chosen.values()), None)
        else:
            raise ValueError(
                f"arm {arm.name}: several baselines ({', '.join(chosen)}); name the one it is compared with"
            )
    return found
