"""What an arm's server needs from an engine, simulated or vLLM: one interface, so telemetry is the same."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class EngineDead(RuntimeError):
    """The engine can serve nothing more (vLLM's engine core process died, the simulated engine's loop raised):
    the replica's health check fails with this message, and Serve replaces the replica."""


@dataclass(frozen=True, slots=True)
class GenerationInput:
    request_id: str
    prompt_text: str | None
    prompt_token_ids: list[int] | None
    max_tokens: int
    ignore_eos: bool = False
    seed: int | None = None
    temperature: float = 1.0
    # Hints for the simulated engine (the `specdrill` body extension); real engines ignore them.
    category: str = "chat"
    prompt_tokens_hint: int | None = None
    output_tokens_hint: int | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    tokens: int
    time: float  # server clock when produced
    prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """The end of a generation: what ran, in vLLM's terms and beyond."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    spec_decode_metrics: dict[str, Any] | None  # vLLM's metrics.speculative_decoding, exact field names
    first_scheduled: float | None
    first_token: float | None
    finished: float
    queue_wait: float | None
    step_batch_sizes: list[int] = field(default_factory=list)  # per engine step this request was in
    step_k: list[int] = field(default_factory=list)  # the k executed in that step, k = 0 included
    engine_id: str = ""  # the engine that served it: for a vLLM data-parallel group, its rank's engine
    dp_rank: int = 0  # that rank (0 when the engine is not data-parallel)


class Engine(Protocol):
    engine_id: str
    kind: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def check_health(self) -> None:
        """Raises EngineDead when the engine can serve nothing more; returns at once otherwise (Serve calls it
        every few seconds)."""
        ...

    def generate(self, request: GenerationInput) -> AsyncIterator[TextDelta | GenerationResult]: ...

    def resolved_speculative_config(self) -> dict[str, Any] | None:
        """The speculative config as the engine holds it after finalising (a dropped schedule shows as None)."""
        ...

    def timeline(self, since_step: int = 0) -> dict[str, list[Any]]:
        """The step timeline from step `since_step`, one list per column: start, end, batch_size, k, drafted,
        accepted, waiting, num_prefill, dp_rank (a data-parallel engine's ranks interleave, each row has its
        rank), and for vLLM num_drafts and k_scheduled. A vLLM k may be None (unknown: see vllm_engine)."""
        ...

    def live(self) -> dict[str, float]:
        """Running batch size, queue length and last executed k, for live metrics."""
        ...

    def versions(self) -> dict[str, str]: ...


@runtime_checkable
class RankedEngine(Protocol):
    """An engine that may run several data-parallel ranks (vLLM) and reports facts of its finalised config."""

    def rank_engine_ids(self) -> dict[int, str]:
        """Each rank's engine id (the engine's own id when it has one rank)."""
        ...

    def live_by_rank(self) -> dict[int, dict[str, float]]: ...

    def engine_facts(self) -> dict[str, Any]:
        """vllm_version, cudagraph_mode, model_runner, executor, async_scheduling, max_model_len (and requested,
        lowered reason), data_parallel_size, engine_ids, schedule_dropped_reason, ..."""
        ...


@runtime_checkable
class UnitScoped(Protocol):
    """An engine whose policy keeps state from step to step (the simulated engine running SGLang's adaptive steps
    or TensorRT-LLM's gate): each unit starts it afresh."""

    def begin_unit(self) -> None: ...


def begin_unit(engine: Engine) -> None:
    """Start a unit: the engine's policy state as a fresh engine's (nothing for an engine without such state)."""
    if isinstance(engine, UnitScoped):
        engine.begin_unit()


def rank_engine_ids(engine: Engine) -> dict[int, str]:
    return engine.rank_engine_ids() if isinstance(engine, RankedEngine) else {0: engine.engine_id}


def live_by_rank(engine: Engine) -> dict[int, dict[str, float]]:
    return engine.live_by_rank() if isinstance(engine, RankedEngine) else {0: engine.live()}


def engine_facts(engine: Engine) -> dict[str, Any]:
    """Facts every arm reports, with None where an engine has no such thing (the simulated engine has no CUDA
    graphs and drops a schedule by policy, not with a logged warning)."""
    facts: dict[str, Any] = {
        "vllm_version": None, "cudagraph_mode": None, "model_runner": None, "executor": None,
        "async_scheduling": None, "max_model_len": None, "max_model_len_requested": None,
        "max_model_len_lowered_reason": None, "data_parallel_size": 1, "schedule_dropped_reason": None,
    }  # fmt: skip
    facts["engine_ids"] = {str(r): e for r, e in rank_engine_ids(engine).items()}
    if isinstance(engine, RankedEngine):
        facts.update(engine.engine_facts())
    return facts
