"""Which `off` arm each arm is measured against: the same hardware, or one engine normalised per engine.

A speedup is only fair on equal hardware. An arm is compared with the `off` arm on the same topology (same
engines, same tensor parallelism). Where the campaign has none, it is compared with `off` on a single engine of
the same tensor parallelism, with goodput and throughput divided by the number of engines, and every output
says so. A campaign with an arm that has neither cannot be compared and is refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from serve_apps.arms import ArmSpec
from serve_apps.policies import Topology


class Baseline(BaseModel):
    model_config = ConfigDict(frozen=True)
    arm: str  # the arm being compared
    baseline: str  # the `off` arm it is compared with
    # How many of the baseline's engines the arm runs: 1 on equal hardware, else rates are divided by it.
    engines_ratio: float

    @property
    def normalised(self) -> bool:
        return self.engines_ratio != 1.0

    def describe(self) -> str:
        if not self.normalised:
            return f"{self.arm} vs {self.baseline} (same hardware)"
        return f"{self.arm} vs {self.baseline} per engine ({self.engines_ratio:g} engines against 1)"


def engines(topology: Topology) -> int:
    """Engines of a topology: each replica and each data-parallel rank is one (a TP group is one engine)."""
    return 1 if topology.kind == "single" else topology.size


class BaselineError(ValueError):
    pass


def baselines(arms: Sequence[ArmSpec]) -> dict[str, Baseline]:
    """The baseline of every arm (an `off` arm is its own, on equal hardware). Raises BaselineError naming the
    first arm that has no `off` arm on its topology nor on a single engine of its tensor parallelism."""
    off = [a for a in arms if a.policy.kind == "off"]
    result: dict[str, Baseline] = {}
    for arm in arms:
        if arm.policy.kind == "off":
            result[arm.name] = Baseline(arm=arm.name, baseline=arm.name, engines_ratio=1.0)
            continue
        same = [o for o in off if o.topology == arm.topology]
        if same:
            result[arm.name] = Baseline(arm=arm.name, baseline=same[0].name, engines_ratio=1.0)
            continue
        one = [
            o for o in off
            if o.topology.kind == "single" and o.topology.tensor_parallel_size == arm.topology.tensor_parallel_size
        ]  # fmt: skip
        if one:
            result[arm.name] = Baseline(arm=arm.name, baseline=one[0].name, engines_ratio=float(engines(arm.topology)))
            continue
        tp = arm.topology.tensor_parallel_size
        single = "single" if tp == 1 else f"single with tensor_parallel_size {tp}"
        raise BaselineError(
            f"arm {arm.name} has no `off` arm to be compared with: add `off` on its topology ({arm.topology.label}, "
            f"same hardware) or on {single} (compared per engine)"
        )
    return result


def one_engine(topology_label: str) -> bool:
    """A topology label (Topology.label) of one engine: `single`, with or without tensor parallelism."""
    return topology_label.split("-tp")[0] == "single"


class ComparedArm(Protocol):
    """What the rule reads of an arm (orchestrator.analysis.read.arms.ArmInfo has it)."""

    @property
    def name(self) -> str: ...
    @property
    def baseline(self) -> bool: ...
    @property
    def compared_with(self) -> str | None: ...
    @property
    def engines_ratio(self) -> float: ...
    @property
    def topology(self) -> str: ...


def primary_baseline(arms: Sequence[ComparedArm]) -> str | None:
    """The `off` arm whose hardware a per-engine decision (a vLLM schedule, the batch map's k evidence) is made
    on, chosen by hardware, never by name or order: one engine first (a schedule is per engine, and vLLM drops
    schedules under data parallelism), then the one most speculative arms are compared with on equal hardware,
    then the fewest tensor-parallel ranks. None without an `off` arm."""
    off = [a for a in arms if a.baseline]
    if not off:
        return None

    def peers(base: ComparedArm) -> int:
        return sum(1 for a in arms if not a.baseline and a.compared_with == base.name and a.engines_ratio == 1)

    def tensor_parallel(base: ComparedArm) -> int:
        _, _, tp = base.topology.partition("-tp")
        return int(tp) if tp.isdigit() else 1

    return min(off, key=lambda a: (not one_engine(a.topology), -peers(a), tensor_parallel(a), a.name)).name
