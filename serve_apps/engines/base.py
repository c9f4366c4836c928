"""What an arm's server needs from an engine, simulated or vLLM: one interface, so telemetry is the same."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


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
    engine_id: str = ""


class Engine(Protocol):
    engine_id: str
    kind: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: GenerationInput) -> AsyncIterator[TextDelta | GenerationResult]: ...

    def resolved_speculative_config(self) -> dict[str, Any] | None:
        """The speculative config as the engine holds it after finalising (a dropped schedule shows as None)."""
        ...

    def timeline(self, since_step: int = 0) -> dict[str, list[float] | list[int]]:
        """Per-engine step timeline from step `since_step`: time, batch size, scheduled k, drafted, accepted."""
        ...

    def live(self) -> dict[str, float]:
        """Running batch size, queue length and last executed k, for live metrics."""
        ...

    def versions(self) -> dict[str, str]: ...
