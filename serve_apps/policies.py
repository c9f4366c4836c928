"""Speculation policies for an arm, in vLLM's own names and semantics.

`off` runs no speculation; `fixed` drafts k tokens every step; `dynamic` picks k per engine step from the
number of requests scheduled in that step (vLLM's num_speculative_tokens_per_batch_size). Validation, gap and
tail inheritance and the clamp to the maximum k follow vllm/v1/spec_decode/dynamic/utils.py; the fallback to
the static k under data parallelism follows VllmConfig._maybe_disable_dynamic_sd_for_data_parallel, and on vLLM
0.33's model runner V1 _maybe_disable_dynamic_sd_for_v1 (serve_apps/vllm_versions.py: which minor does what).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import Field, TypeAdapter, model_validator

from serve_apps.policies_sglang import SglangAdaptivePolicy
from serve_apps.policies_trtllm import TrtllmAcceptanceGatePolicy, TrtllmMaxConcurrencyPolicy, TrtllmSchedulePolicy
from serve_apps.resolved import SINGLE as SINGLE
from serve_apps.resolved import PolicyError as PolicyError
from serve_apps.resolved import ResolvedSpeculation as ResolvedSpeculation
from serve_apps.resolved import ScheduleEntry as ScheduleEntry
from serve_apps.resolved import StrictModel
from serve_apps.resolved import Topology as Topology
from serve_apps.resolved import dense_schedule as dense_schedule
from serve_apps.spec_knobs import KnobFields, check_knobs, knob_config, knob_label
from serve_apps.vllm_versions import VllmTarget, v1_drop

# A subset of vLLM 0.32's SpeculativeMethod literal (vllm/config/speculative.py); a test checks it stays a subset.
# medusa and mlp_speculator left it in 0.33: an engine on 0.33+ refuses them (serve_apps/vllm_versions.py).
SpecMethod = Literal[
    "eagle",
    "eagle3",
    "ngram",
    "ngram_gpu",
    "draft_model",
    "medusa",
    "mlp_speculator",
    "suffix",
    "deepseek_mtp",
    "qwen3_next_mtp",
    "glm4_moe_mtp",
    "mimo_mtp",
    "ernie_mtp",
    "dflash",
]
METHODS_NEEDING_DRAFTER: frozenset[str] = frozenset(
    {"eagle", "eagle3", "draft_model", "medusa", "mlp_speculator", "dflash"}
)
METHODS_WITHOUT_DRAFTER: frozenset[str] = frozenset({"ngram", "ngram_gpu", "suffix"})

_Strict = StrictModel


def parse_topology(text: str) -> Topology:
    """The short form: 'single' | 'replicas:N' | 'data_parallel:N'."""
    if text == "single":
        return Topology()
    kind, _, size = text.partition(":")
    if kind in {"replicas", "data_parallel"} and size.isdigit():
        return Topology(kind=kind, size=int(size))  # type: ignore[arg-type]
    raise ValueError(f"topology {text!r}: expected single, replicas:N or data_parallel:N")


def validate_schedule(entries: Any) -> tuple[ScheduleEntry, ...]:
    """vLLM's checks, in vLLM's order, each naming the offending entry; returns the schedule sorted by start."""
    if not isinstance(entries, list | tuple) or not entries:
        raise PolicyError("schedule must be a non-empty list of [start, end, k] entries")
    parsed: list[ScheduleEntry] = []
    for i, entry in enumerate(entries):
        if (
            not isinstance(entry, list | tuple)
            or len(entry) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in entry)
        ):
            raise PolicyError(f"schedule entry {i} {entry!r}: must be [start, end, k] with three integers")
        start, end, k = entry
        if start <= 0 or end <= 0:
            raise PolicyError(f"schedule entry {i} {list(entry)}: batch-size range must be positive")
        if start > end:
            raise PolicyError(f"schedule entry {i} {list(entry)}: start {start} is greater than end {end}")
        if k < 0:
            raise PolicyError(f"schedule entry {i} {list(entry)}: k must be >= 0")
        parsed.append((start, end, k))
    ordered = sorted(parsed, key=lambda e: e[0])
    previous: ScheduleEntry | None = None
    for entry in ordered:
        if previous is not None and entry[0] <= previous[1]:
            raise PolicyError(f"schedule entries {list(previous)} and {list(entry)} overlap")
        previous = entry
    if ordered[0][0] != 1:
        raise PolicyError(
            f"schedule entry {list(ordered[0])}: the first batch-size range must start at 1 so every batch size has a k"
        )
    return tuple(ordered)


def runnable_as_written(policy: AnyPolicy, *, max_num_seqs: int, max_draft_tokens: int | None) -> None:
    """Refuse what vLLM would accept but run differently from how it is written; raises PolicyError.

    vLLM 0.32 (vllm/v1/spec_decode/dynamic/utils.py, build_dynamic_sd_schedule_lookup, run when the scheduler
    starts) clamps every schedule k to num_speculative_tokens and fills batch sizes 1..max_num_seqs only: a k above
    the maximum silently runs as the maximum, and a range starting above max_num_seqs is never looked up. Both
    are refused here, so an arm's label is what it runs. What vLLM itself refuses (validate_schedule above), it
    refuses too; it sorts an unsorted schedule, and so does validate_schedule. A last range ending above
    max_num_seqs is accepted, as vLLM accepts it: its own examples end at 512 whatever max_num_seqs is.
    `max_draft_tokens` is the drafter's limit where one is known (a simulated profile's limits.max_draft_tokens)."""
    if isinstance(policy, OffPolicy):
        return
    k = policy.k if isinstance(policy, FixedPolicy) else policy.max_k
    if max_draft_tokens is not None and k > max_draft_tokens:
        what = "k" if isinstance(policy, FixedPolicy) else "max k"
        raise PolicyError(f"{what} {k} is above the drafter's limit of {max_draft_tokens} draft tokens per step")
    if not isinstance(policy, DynamicPolicy):
        return
    for start, end, k_range in policy.schedule:
        if k_range > policy.max_k:
            raise PolicyError(
                f"schedule entry {[start, end, k_range]}: k {k_range} is above max k {policy.max_k}; vLLM would "
                f"silently clamp it to {policy.max_k} (build_dynamic_sd_schedule_lookup)"
            )
        if start > max_num_seqs:
            raise PolicyError(
                f"schedule entry {[start, end, k_range]}: starts above max_num_seqs {max_num_seqs}, so no engine "
                "step ever has that batch size (vLLM's lookup stops at max_num_seqs)"
            )


class OffPolicy(_Strict):
    kind: Literal["off"] = "off"

    @property
    def label(self) -> str:
        return "off"

    @property
    def max_k(self) -> int:
        return 0

    def to_vllm_speculative_config(self) -> dict[str, Any] | None:
        return None

    def resolve(self, topology: Topology = SINGLE, vllm: VllmTarget | None = None) -> ResolvedSpeculation:
        return ResolvedSpeculation(method=None, num_speculative_tokens=0, schedule=None)


class _Speculative(KnobFields, _Strict):
    method: SpecMethod = Field(description="vLLM's speculative method")
    model: str | None = Field(
        default=None, description="the drafter (required by methods with a drafter network; none for n-gram and suffix)"
    )
    prompt_lookup_max: int | None = Field(
        default=None, ge=1, description="n-gram: longest n-gram to match in the prompt (vLLM's name)"
    )
    prompt_lookup_min: int | None = Field(
        default=None, ge=1, description="n-gram: shortest n-gram to match (vLLM's name)"
    )

    @property
    def draft_window(self) -> int:
        """vLLM's num_speculative_tokens: what the knobs' rules measure their lengths against."""
        raise NotImplementedError

    @model_validator(mode="after")
    def _knobs_as_vllm(self) -> Self:
        check_knobs(self, self.draft_window)
        return self

    @model_validator(mode="after")
    def _drafter_matches_method(self) -> Self:
        if self.method in METHODS_NEEDING_DRAFTER and not self.model:
            raise ValueError(f"method {self.method!r} needs a drafter model ('model')")
        if self.method in METHODS_WITHOUT_DRAFTER and self.model:
            raise ValueError(f"method {self.method!r} takes no drafter model, got model={self.model!r}")
        is_ngram = self.method in {"ngram", "ngram_gpu"}
        if not is_ngram and (self.prompt_lookup_max is not None or self.prompt_lookup_min is not None):
            raise ValueError(f"prompt_lookup_max/min apply to n-gram methods only, not {self.method!r}")
        if (
            self.prompt_lookup_max is not None
            and self.prompt_lookup_min is not None
            and self.prompt_lookup_min > self.prompt_lookup_max
        ):
            raise ValueError(
                f"prompt_lookup_min {self.prompt_lookup_min} is greater than prompt_lookup_max {self.prompt_lookup_max}"
            )
        return self

    def _base_config(self, k: int) -> dict[str, Any]:
        config: dict[str, Any] = {"method": self.method, "num_speculative_tokens": k, **knob_config(self, k)}
        if self.model is not None:
            config["model"] = self.model
        if self.prompt_lookup_max is not None:
            config["prompt_lookup_max"] = self.prompt_lookup_max
        if self.prompt_lookup_min is not None:
            config["prompt_lookup_min"] = self.prompt_lookup_min
        return config


class FixedPolicy(_Speculative):
    kind: Literal["fixed"] = "fixed"
    k: int = Field(ge=1, description="vLLM's `num_speculative_tokens`: tokens drafted every step")

    @property
    def draft_window(self) -> int:
        return self.k

    @property
    def max_k(self) -> int:
        return self.k

    @property
    def label(self) -> str:
        return f"fixed-{self.method}-k{self.k}{knob_label(self)}"

    def to_vllm_speculative_config(self) -> dict[str, Any]:
        return self._base_config(self.k)

    def resolve(self, topology: Topology = SINGLE, vllm: VllmTarget | None = None) -> ResolvedSpeculation:
        return ResolvedSpeculation(method=self.method, num_speculative_tokens=self.k, schedule=None)


class DynamicPolicy(_Speculative):
    """max_k is vLLM's num_speculative_tokens: the draft window every schedule entry is clamped to."""

    kind: Literal["dynamic"] = "dynamic"
    max_k: int = Field(
        ge=1, description="vLLM's `num_speculative_tokens`; under data parallelism vLLM runs this k in every step"
    )
    schedule: tuple[ScheduleEntry, ...] = Field(
        description=(
            "vLLM's `num_speculative_tokens_per_batch_size`: `[start, end, k]` by batch size, sorted, not "
            "overlapping, the first starting at 1; gaps and the tail keep the previous k"
        )
    )

    @model_validator(mode="before")
    @classmethod
    def _validate_schedule(cls, data: Any) -> Any:
        if isinstance(data, dict) and "schedule" in data:
            data = {**data, "schedule": validate_schedule(data["schedule"])}
        return data

    @property
    def draft_window(self) -> int:
        return self.max_k

    @property
    def label(self) -> str:
        ranges = ",".join(f"{s}-{e}={k}" for s, e, k in self.schedule)
        return f"dynamic-{self.method}-k{self.max_k}[{ranges}]{knob_label(self)}"

    def to_vllm_speculative_config(self) -> dict[str, Any]:
        return {
            **self._base_config(self.max_k),
            "num_speculative_tokens_per_batch_size": [list(e) for e in self.schedule],
        }

    def resolve(self, topology: Topology = SINGLE, vllm: VllmTarget | None = None) -> ResolvedSpeculation:
        """What vLLM runs: `vllm` is the engine's vLLM (None: only the drop every supported minor makes). vLLM
        checks data parallelism first, then 0.33's model runner V1 (config/vllm.py 0.33:1862-1863)."""
        if topology.data_parallel_size > 1:
            return ResolvedSpeculation(
                method=self.method,
                num_speculative_tokens=self.max_k,
                schedule=None,
                schedule_dropped=True,
                dropped_reason=(
                    f"data_parallel_size={topology.data_parallel_size}: vLLM disables "
                    f"num_speculative_tokens_per_batch_size and falls back to static "
                    f"num_speculative_tokens={self.max_k}"
                ),
            )
        on_v1 = None if vllm is None else v1_drop(vllm, self.method, self.max_k)
        if on_v1 is not None:
            return ResolvedSpeculation(
                method=self.method, num_speculative_tokens=self.max_k, schedule=None, schedule_dropped=True,
                dropped_reason=on_v1,
            )  # fmt: skip
        return ResolvedSpeculation(method=self.method, num_speculative_tokens=self.max_k, schedule=self.schedule)


# The other engines' designs (SGLang's adaptive steps, TensorRT-LLM's schedule, concurrency cap and acceptance
# gate): mapping form only, each in its engine's own terms (policies_sglang.py, policies_trtllm.py).
OtherEnginePolicy = (
    SglangAdaptivePolicy | TrtllmSchedulePolicy | TrtllmMaxConcurrencyPolicy | TrtllmAcceptanceGatePolicy
)
AnyPolicy = OffPolicy | FixedPolicy | DynamicPolicy | OtherEnginePolicy
Policy = Annotated[AnyPolicy, Field(discriminator="kind")]
POLICY_ADAPTER: TypeAdapter[AnyPolicy] = TypeAdapter(Policy)

_POLICY_START = re.compile(r",(?=\s*(?:off|fixed|dynamic|sglang_adaptive|trtllm_\w+)\b)")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*=\s*(\d+)\s*$")


def split_policy_list(text: str) -> list[str]:
    """'off,fixed:3,dynamic:3:1-64=3,65-128=1' -> ['off', 'fixed:3', 'dynamic:3:1-64=3,65-128=1']."""
    return [part.strip() for part in _POLICY_START.split(text) if part.strip()]


def parse_policy(text: str, *, default_method: str, default_model: str | None) -> AnyPolicy:
    """Short CLI form: off | fixed[:METHOD]:K | dynamic[:METHOD]:MAXK:S-E=K,S-E=K,... | the other engines' forms
    (_parse_other)."""
    parts = [p.strip() for p in text.strip().split(":")]
    kind = parts[0]
    if kind == "sglang_adaptive" or kind.startswith("trtllm_"):
        return policy_from_dict(_parse_other(text, parts, default_model), where=f"policy {text!r}")
    if kind == "off" and len(parts) == 1:
        return OffPolicy()
    if kind not in {"fixed", "dynamic"}:
        raise PolicyError(f"policy {text!r}: expected off, fixed[:METHOD]:K or dynamic[:METHOD]:MAXK:SCHEDULE")
    n_tail = 1 if kind == "fixed" else 2
    if len(parts) not in {1 + n_tail, 2 + n_tail}:
        form = "fixed[:METHOD]:K" if kind == "fixed" else "dynamic[:METHOD]:MAXK:S-E=K,..."
        raise PolicyError(f"policy {text!r}: expected {form}")
    method = parts[1] if len(parts) == 2 + n_tail else default_method
    k_text = parts[-n_tail]
    if not k_text.isdigit():
        raise PolicyError(f"policy {text!r}: k {k_text!r} is not a non-negative integer")
    model = None if method in METHODS_WITHOUT_DRAFTER else default_model
    data: dict[str, Any] = {"kind": kind, "method": method, "model": model}
    if kind == "fixed":
        data["k"] = int(k_text)
    else:
        data["max_k"] = int(k_text)
        schedule = []
        for piece in parts[-1].split(","):
            match = _RANGE.match(piece)
            if match is None:
                raise PolicyError(f"policy {text!r}: schedule range {piece!r} is not START-END=K")
            schedule.append([int(g) for g in match.groups()])
        data["schedule"] = schedule
    return policy_from_dict(data, where=f"policy {text!r}")


def _parse_other(text: str, parts: list[str], default_model: str | None) -> dict[str, Any]:
    """sglang_adaptive:STEPS (SGLang's shipped slots, EAGLE) | trtllm_schedule:lower_bounds|upper_bounds:MAXK:B=K,...
    | trtllm_max_concurrency:MAXK:N | trtllm_acceptance_gate:MAXK:WINDOW:THRESHOLD; TensorRT-LLM's take a last
    `:floor0_fault` to plant bug #16888."""
    kind, args = parts[0], parts[1:]
    fault = bool(args) and args[-1] == "floor0_fault"
    args = args[:-1] if fault else args
    arity = {"sglang_adaptive": 1, "trtllm_schedule": 3, "trtllm_max_concurrency": 2, "trtllm_acceptance_gate": 3}
    if kind not in arity or len(args) != arity[kind] or (fault and kind == "sglang_adaptive"):
        raise PolicyError(
            f"policy {text!r}: expected sglang_adaptive:STEPS, trtllm_schedule:lower_bounds|upper_bounds:MAXK:B=K,..., "
            "trtllm_max_concurrency:MAXK:N or trtllm_acceptance_gate:MAXK:WINDOW:THRESHOLD"
        )
    try:
        if kind == "sglang_adaptive":
            return {"kind": kind, "method": "eagle", "model": default_model or "", "num_steps": int(args[0])}
        data: dict[str, Any] = {"kind": kind, "max_draft_len": int(args[1 if kind == "trtllm_schedule" else 0])}
        if kind == "trtllm_schedule":
            pairs = [piece.split("=") for piece in args[2].split(",")]
            data.update(keys=args[0], draft_len_schedule={int(b): int(k) for b, k in pairs})
        elif kind == "trtllm_max_concurrency":
            data["max_concurrency"] = int(args[1])
        else:
            data.update(acceptance_rate_window_size=int(args[1]), acceptance_rate_threshold=float(args[2]))
    except ValueError:
        raise PolicyError(f"policy {text!r}: a number is not a number") from None
    return {**data, "speculative_model": default_model, "floor0_fault": fault}


def policy_from_dict(data: Any, *, where: str = "policy") -> AnyPolicy:
    from pydantic import ValidationError

    from serve_apps.config_io import first_error

    try:
        return POLICY_ADAPTER.validate_python(data)
    except PolicyError as exc:
        raise PolicyError(f"{where}: {exc}") from None
    except ValidationError as exc:
        raise PolicyError(f"{where}: {first_error(exc, skip_loc=1)}") from None
