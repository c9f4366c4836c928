"""What an engine runs: the topology it is laid out on and the speculation it resolves a policy to.

Apart from the policies (serve_apps/policies.py, policies_sglang.py, policies_trtllm.py) so that every policy
module can resolve to it without importing the others. `ResolvedSpeculation` is vLLM's view (method, static
k, batch-size schedule) plus, for the other engines' designs, the stateful rule the simulated engine runs step
by step (`rule`), whether a step with k = 0 still pays the idle drafter, and TensorRT-LLM's floor-0 fault.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

ScheduleEntry = tuple[int, int, int]


class PolicyError(ValueError):
    pass


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Topology(StrictModel):
    """How an arm's engines are laid out: one engine, N independent replicas, or one vLLM DP group of N ranks."""

    kind: Literal["single", "replicas", "data_parallel"] = Field(
        default="single",
        description="`data_parallel` is one vLLM DP group (vLLM drops a dynamic schedule there: static max k)",
    )
    size: int = Field(default=1, ge=1, description="engines (`replicas`) or data-parallel ranks (`data_parallel`)")
    tensor_parallel_size: int = Field(default=1, ge=1, description="passed to vLLM")
    # A topology's, not a policy's: vLLM reads it only in its data-parallel engine core (DPEngineCoreProc, MoE
    # models; v1/engine/core.py 0.32:2162, 2318-2326), where it admits new prefills once every N steps, aligned
    # across the ranks. It balances the ranks' step times; it does nothing to a single engine or to replicas.
    prefill_schedule_interval: int = Field(
        default=1,
        ge=1,
        description=(
            "vLLM's `prefill_schedule_interval` (`data_parallel` only; MoE models): new prefills admitted once "
            "every N engine steps, aligned across the ranks"
        ),
    )

    @model_validator(mode="after")
    def _single_is_one(self) -> Self:
        if self.kind == "single" and self.size != 1:
            raise ValueError(f"topology 'single' has exactly one engine, got size {self.size}")
        if self.prefill_schedule_interval != 1 and self.kind != "data_parallel":
            raise ValueError(
                f"prefill_schedule_interval {self.prefill_schedule_interval}: vLLM reads it only in a data-parallel "
                f"engine (kind data_parallel), not {self.kind}"
            )
        return self

    @property
    def data_parallel_size(self) -> int:
        return self.size if self.kind == "data_parallel" else 1

    @property
    def label(self) -> str:
        base = "single" if self.kind == "single" else f"{self.kind}{self.size}"
        if self.tensor_parallel_size != 1:
            base = f"{base}-tp{self.tensor_parallel_size}"
        return base if self.prefill_schedule_interval == 1 else f"{base}-prefill-every{self.prefill_schedule_interval}"


SINGLE = Topology()


class SglangTier(StrictModel):
    """One batch-size slot of SGLang's adaptive steps (speculative/adaptive_spec_params.py 0.5.23:153-185)."""

    lower_bound: int = Field(ge=1, description="the slot's key: batch sizes (after CUDA-graph padding) from here up")
    candidate_steps: tuple[int, ...] = Field(min_length=1, description="the steps this slot may choose, sorted")
    up_hysteresis: float = 0.0
    down_hysteresis: float = -0.25
    ceiling_coeff: float = 0.0


class SglangRule(StrictModel):
    """SGLang's per-slot EMA controller, as the simulated engine runs it (serve_apps/sim/rules/sglang_adaptive.py)."""

    kind: Literal["sglang_adaptive"] = "sglang_adaptive"
    tiers: tuple[SglangTier, ...] = Field(min_length=1)
    initial_steps: int = Field(ge=0, description="`--speculative-num-steps`: each slot starts there if a candidate")
    ema_alpha: float = Field(default=0.2, gt=0, le=1)
    update_interval: int = Field(default=5, ge=1)
    warmup_batches: int = Field(default=10, ge=0)
    cuda_graph: bool = Field(default=True, description="decode CUDA graphs on: a batch is padded to a graph size")
    cuda_graph_max_bs: int | None = Field(
        default=None, ge=1, description="the largest graph (None: SGLang's default, 256 at most max_num_seqs)"
    )


class GateRule(StrictModel):
    """TensorRT-LLM's SpeculationGate: off for good once the rolling acceptance rate is below the threshold."""

    kind: Literal["trtllm_acceptance_gate"] = "trtllm_acceptance_gate"
    window: int = Field(ge=1)
    threshold: float = Field(ge=0, le=1)


class ResolvedSpeculation(StrictModel):
    """The speculative config an engine really runs with, after the engine has finalised it.

    `schedule` is vLLM's form of a batch-size table; the other engines' stateless rules (TensorRT-LLM's
    draft_len_schedule and max_concurrency) resolve to the same form. `rule` is a stateful rule run per step
    (SGLang's adaptive steps, TensorRT-LLM's acceptance gate); `k0_idle_drafter` says whether a step with k = 0
    pays the idle drafter (vLLM, SGLang) or nothing (TensorRT-LLM); `floor0_fault` plants TensorRT-LLM's fault
    (a request that decoded through a k = 0 step accepts no draft afterwards)."""

    method: str | None
    num_speculative_tokens: int
    schedule: tuple[ScheduleEntry, ...] | None
    schedule_dropped: bool = False
    dropped_reason: str | None = None
    rule: SglangRule | GateRule | None = Field(default=None, discriminator="kind")
    k0_idle_drafter: bool = True
    floor0_fault: bool = False

    def k_table(self, max_num_seqs: int) -> list[int]:
        """Dense 1-indexed batch size -> k for batch sizes 1..max_num_seqs (index 0 unused)."""
        if self.method is None:
            return [0] * (max_num_seqs + 1)
        if self.schedule is None:
            return [0] + [self.num_speculative_tokens] * max_num_seqs
        return dense_schedule(self.schedule, max_num_seqs, self.num_speculative_tokens)

    def k_for_batch(self, batch_size: int, max_num_seqs: int) -> int:
        if not 1 <= batch_size <= max_num_seqs:
            raise ValueError(f"batch size {batch_size} outside 1..max_num_seqs={max_num_seqs}")
        if self.rule is not None:
            raise ValueError(f"{self.rule.kind}: k depends on the steps before, not on the batch size alone")
        return self.k_table(max_num_seqs)[batch_size]


def dense_schedule(schedule: tuple[ScheduleEntry, ...], max_batch: int, max_k: int) -> list[int]:
    """Expand a validated schedule: gaps and the tail inherit the previous k, every k clamped to max_k."""
    table = [0] * (max_batch + 1)
    k_so_far = min(schedule[0][2], max_k)
    entries = iter(schedule)
    current = next(entries, None)
    for batch in range(1, max_batch + 1):
        while current is not None and batch > current[1]:
            current = next(entries, None)
        if current is not None and current[0] <= batch:
            k_so_far = min(current[2], max_k)
        table[batch] = k_so_far
    return table


def table_to_schedule(table: list[int]) -> tuple[ScheduleEntry, ...]:
    """A dense 1-indexed batch -> k table as vLLM-style [start, end, k] ranges (runs of equal k)."""
    entries: list[ScheduleEntry] = []
    for batch in range(1, len(table)):
        if entries and entries[-1][2] == table[batch]:
            entries[-1] = (entries[-1][0], batch, table[batch])
        else:
            entries.append((batch, batch, table[batch]))
    return tuple(entries)
