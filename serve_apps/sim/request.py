"""A request inside the simulated engine and what the engine records about it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

FinishReason = Literal["length", "stop"]


@dataclass(slots=True, eq=False)
class SimRequest:
    """Identity and outcome of a request. While it runs, its live state sits in the engine's slot arrays."""

    request_id: str
    category: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    # Where the model would emit EOS; None means generate up to max_tokens (ignore_eos).
    stop_at: int | None = None

    uid: int = -1  # engine-assigned, keys the engine's request-step log
    output: int = 0
    preemptions: int = 0
    first_chunk: int = 0  # first request-step log chunk that can hold this request's rows
    first_scheduled: float | None = None
    first_token: float | None = None
    finished_at: float | None = None
    finish_reason: FinishReason | None = None

    @property
    def target_tokens(self) -> int:
        return self.max_tokens if self.stop_at is None else min(self.max_tokens, self.stop_at)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What the engine reports for a finished request: vLLM's detailed spec-decode metrics and more."""

    request_id: str
    category: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    finish_reason: FinishReason
    arrival: float
    first_scheduled: float
    first_token: float
    finished: float
    preemptions: int
    token_times: np.ndarray  # one timestamp per output token
    step_batch_size: np.ndarray  # every step this request was scheduled in, k = 0 steps included
    step_k: np.ndarray  # the k the engine scheduled in that step (the draft length it ran)
    step_drafted: np.ndarray  # drafts verified for this request in that step (0 included)
    step_accepted: np.ndarray
    num_spec_tokens: int  # configured maximum k (0 without speculation)

    @property
    def queue_wait(self) -> float:
        return self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finished - self.arrival

    @property
    def tpot(self) -> float:
        return (self.finished - self.first_token) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0

    def spec_decode_metrics(self) -> dict[str, Any] | None:
        """metrics.speculative_decoding as vLLM reports it with per_request_spec_decode_metrics="detailed".

        Like vLLM, steps that verified no draft tokens are left out of every field.
        """
        if self.num_spec_tokens == 0:
            return None
        mask = self.step_drafted > 0
        drafted = self.step_drafted[mask]
        accepted = self.step_accepted[mask]
        histogram = np.bincount(accepted, minlength=self.num_spec_tokens + 1)[: self.num_spec_tokens + 1]
        steps = int(mask.sum())
        num_accepted = int(accepted.sum())
        num_drafted = int(drafted.sum())
        result: dict[str, Any] = {
            "mean_acceptance_length": 1.0 + num_accepted / steps if steps else 1.0,
            "draft_acceptance_rate": num_accepted / num_drafted if num_drafted else 0.0,
            "acceptance_histogram": [int(x) for x in histogram],
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": num_accepted,
            "num_draft_tokens": num_drafted,
            "num_spec_tokens": self.num_spec_tokens,
        }
        if steps:
            result["per_step_accepted"] = [int(x) for x in accepted]
            result["per_step_drafted"] = [int(x) for x in drafted]
        return result
