"""What the analysis needs to know about an arm: its declared policy, as configured, and where it ran."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_apps.policies import (
    SINGLE,
    DynamicPolicy,
    FixedPolicy,
    OffPolicy,
    ScheduleEntry,
    Topology,
    dense_schedule,
    validate_schedule,
)

PolicyKind = Literal["off", "fixed", "dynamic"]


class ArmInfo(BaseModel):
    """The configured policy, not the resolved one: verification compares what ran against what was asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    kind: PolicyKind
    k: int = Field(default=0, ge=0)  # fixed: k; dynamic: max_k (vLLM's num_speculative_tokens); off: 0
    schedule: tuple[ScheduleEntry, ...] | None = None  # dynamic only: [start, end, k] as configured
    topology: str = "single"
    data_parallel_size: int = Field(default=1, ge=1)
    max_num_seqs: int = Field(default=512, ge=1)
    baseline: bool = False  # an `off` arm: other arms' speedups are measured against it
    # The baseline this arm is compared with (orchestrator/baselines.py): `off` on its topology, or on one engine
    # with rates per engine (engines_ratio engines against one). None: the campaign's only baseline.
    compared_with: str | None = None
    engines_ratio: float = Field(default=1.0, gt=0)
    method: str | None = None  # the speculative method (an n-gram drafter may propose fewer tokens than k)

    @model_validator(mode="after")
    def _policy_is_whole(self) -> Self:
        if self.kind == "off" and (self.k or self.schedule):
            raise ValueError(f"arm {self.name!r}: an off arm has no k and no schedule")
        if self.kind == "fixed" and (self.k < 1 or self.schedule):
            raise ValueError(f"arm {self.name!r}: a fixed arm has k >= 1 and no schedule")
        if self.kind == "dynamic":
            if self.k < 1 or not self.schedule:
                raise ValueError(f"arm {self.name!r}: a dynamic arm has max k >= 1 and a schedule")
            validate_schedule(self.schedule)
        return self

    @classmethod
    def from_policy(
        cls,
        name: str,
        policy: OffPolicy | FixedPolicy | DynamicPolicy,
        *,
        topology: Topology = SINGLE,
        max_num_seqs: int = 512,
        baseline: bool | None = None,
        compared_with: str | None = None,
        engines_ratio: float = 1.0,
    ) -> ArmInfo:
        k = policy.k if isinstance(policy, FixedPolicy) else policy.max_k if isinstance(policy, DynamicPolicy) else 0
        return cls(
            name=name,
            kind=policy.kind,
            k=k,
            schedule=policy.schedule if isinstance(policy, DynamicPolicy) else None,
            topology=topology.label,
            data_parallel_size=topology.data_parallel_size,
            max_num_seqs=max_num_seqs,
            baseline=policy.kind == "off" if baseline is None else baseline,
            compared_with=compared_with,
            engines_ratio=engines_ratio,
            method=None if isinstance(policy, OffPolicy) else policy.method,
        )

    def k_table(self) -> np.ndarray:
        """Configured k for batch sizes 0..max_num_seqs (index 0 unused), clamped to max k as vLLM does."""
        if self.kind == "off":
            return np.zeros(self.max_num_seqs + 1, dtype=np.int64)
        if self.kind == "fixed" or self.schedule is None:
            table = np.full(self.max_num_seqs + 1, self.k, dtype=np.int64)
            table[0] = 0
            return table
        return np.asarray(dense_schedule(self.schedule, self.max_num_seqs, self.k), dtype=np.int64)

    @property
    def expects_static_fallback(self) -> bool:
        """vLLM drops a dynamic schedule under data parallelism and runs the static max k."""
        return self.kind == "dynamic" and self.data_parallel_size > 1


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
