"""TensorRT-LLM's load-dependent speculation as arms' policies, in its `speculative_config` terms (PyTorch backend).

`trtllm_schedule` (`draft_len_schedule`, with its key semantics named: `lower_bounds` as the two-model drafter
reads it, PR #8194, `upper_bounds` as the one-model EAGLE3/MTP path reads it, PR #10860), `trtllm_max_concurrency`
(`max_concurrency`), `trtllm_acceptance_gate` (`acceptance_rate_window_size` + `acceptance_rate_threshold`). The
rules: serve_apps/sim/rules/trtllm_schedule.py and trtllm_gate.py. A step with k = 0 runs no drafter.
`floor0_fault` plants TensorRT-LLM bug #16888 (open): after a k = 0 phase the one-model drafter's state is not
refreshed, so the requests that decoded through it accept no draft for the rest of their lives.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from serve_apps.resolved import SINGLE, GateRule, ResolvedSpeculation, StrictModel, Topology, table_to_schedule
from serve_apps.sim.rules.trtllm_schedule import max_concurrency_table, schedule_table

# The largest batch a table is written for; the simulated engine reads it up to its own max_num_seqs.
TABLE_BATCHES = 4096


class _TrtllmBase(StrictModel):
    decoding_type: Literal["Eagle3", "MTP", "Draft_Target", "NGram"] = Field(
        default="Eagle3", description="TensorRT-LLM's decoding type (the simulated engine drafts with its profile's)"
    )
    speculative_model: str | None = Field(default=None, description="the drafter, where the decoding type has one")
    max_draft_len: int = Field(ge=1, description="`max_draft_len`: drafts per step when speculating")
    floor0_fault: bool = Field(
        default=False,
        description="plant TensorRT-LLM's floor-0 fault: requests that decoded through a k = 0 step accept no "
        "draft afterwards",
    )

    @property
    def max_k(self) -> int:
        return self.max_draft_len

    def _config(self, **extra: Any) -> dict[str, Any]:
        config: dict[str, Any] = {"decoding_type": self.decoding_type, "max_draft_len": self.max_draft_len, **extra}
        if self.speculative_model is not None:
            config["speculative_model"] = self.speculative_model
        return config

    def _resolved(self, table: list[int] | None, rule: GateRule | None = None) -> ResolvedSpeculation:
        return ResolvedSpeculation(
            method=self.decoding_type, num_speculative_tokens=self.max_draft_len,
            schedule=None if table is None else table_to_schedule(table), rule=rule, k0_idle_drafter=False,
            floor0_fault=self.floor0_fault,
        )  # fmt: skip

    @property
    def _fault_label(self) -> str:
        return "-floor0-fault" if self.floor0_fault else ""


class TrtllmSchedulePolicy(_TrtllmBase):
    kind: Literal["trtllm_schedule"] = "trtllm_schedule"
    draft_len_schedule: dict[int, int] = Field(
        min_length=1, description="`draft_len_schedule`: batch-size key -> draft length, read as `keys` says"
    )
    keys: Literal["lower_bounds", "upper_bounds"] = Field(
        description=(
            "`lower_bounds`: the largest key <= the batch wins (the two-model drafter; `{1: 4, 4: 2, 8: 0}`); "
            "`upper_bounds`: the smallest key >= the batch wins, above every key 0 (the one-model "
            "EAGLE3/MTP path; `{4: 4, 8: 2, 32: 1}` = 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0)"
        )
    )

    @model_validator(mode="after")
    def _schedule_as_trtllm(self) -> Self:
        """llm_args.py's draft_len_schedule validator: keys >= 1, lengths >= 0; lower bounds need key 1 equal to
        max_draft_len. specdrill also refuses a length above max_draft_len (it could not be run as written)."""
        for batch, length in self.draft_len_schedule.items():
            if batch < 1:
                raise ValueError(f"draft_len_schedule: batch size threshold must be >= 1, got {batch}")
            if not 0 <= length <= self.max_draft_len:
                raise ValueError(f"draft_len_schedule[{batch}] = {length}: must be in 0..max_draft_len")
        if self.keys == "lower_bounds":
            if 1 not in self.draft_len_schedule:
                raise ValueError("draft_len_schedule must include batch_size=1 (lower-bound keys)")
            if self.draft_len_schedule[1] != self.max_draft_len:
                raise ValueError("draft_len_schedule[1] must equal max_draft_len for consistency")
        return self

    @property
    def label(self) -> str:
        entries = ",".join(f"{b}:{k}" for b, k in sorted(self.draft_len_schedule.items()))
        return f"trtllm-schedule-{self.keys.replace('_', '-')}-k{self.max_draft_len}[{entries}]{self._fault_label}"

    def to_engine_config(self) -> dict[str, Any]:
        return self._config(draft_len_schedule=dict(sorted(self.draft_len_schedule.items())))

    def resolve(self, topology: Topology = SINGLE, vllm: Any = None) -> ResolvedSpeculation:
        return self._resolved(schedule_table(self.draft_len_schedule, self.keys, TABLE_BATCHES))


class TrtllmMaxConcurrencyPolicy(_TrtllmBase):
    kind: Literal["trtllm_max_concurrency"] = "trtllm_max_concurrency"
    max_concurrency: int = Field(ge=1, description="`max_concurrency`: speculation off above this many requests")
    max_num_tokens: int = Field(
        default=8192, ge=1, description="the engine's `max_num_tokens` (caps the effective request count)"
    )

    @property
    def label(self) -> str:
        return f"trtllm-max-concurrency{self.max_concurrency}-k{self.max_draft_len}{self._fault_label}"

    def to_engine_config(self) -> dict[str, Any]:
        return self._config(max_concurrency=self.max_concurrency)

    def resolve(self, topology: Topology = SINGLE, vllm: Any = None) -> ResolvedSpeculation:
        table = max_concurrency_table(self.max_concurrency, self.max_draft_len, TABLE_BATCHES, self.max_num_tokens)
        return self._resolved(table)


class TrtllmAcceptanceGatePolicy(_TrtllmBase):
    kind: Literal["trtllm_acceptance_gate"] = "trtllm_acceptance_gate"
    acceptance_rate_window_size: int = Field(ge=1, description="speculating iterations in the rolling mean")
    acceptance_rate_threshold: float = Field(
        ge=0, le=1, description="below this rolling mean of accepted / drafted, speculation is off for good"
    )

    @property
    def label(self) -> str:
        return (
            f"trtllm-gate-k{self.max_draft_len}-w{self.acceptance_rate_window_size}"
            f"-t{self.acceptance_rate_threshold:g}{self._fault_label}"
        )

    def to_engine_config(self) -> dict[str, Any]:
        return self._config(
            acceptance_rate_window_size=self.acceptance_rate_window_size,
            acceptance_rate_threshold=self.acceptance_rate_threshold,
        )

    def resolve(self, topology: Topology = SINGLE, vllm: Any = None) -> ResolvedSpeculation:
        gate = GateRule(window=self.acceptance_rate_window_size, threshold=self.acceptance_rate_threshold)
        return self._resolved(None, gate)
