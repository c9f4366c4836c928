"""vLLM's step timeline (serve_apps/engines/step_timeline.py StepTimeline) from synthetic stat-logger steps: when a
step started, with and without async scheduling, and which steps a request was in, found without timing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from serve_apps.engines.step_timeline import StepStats, StepTimeline


def _step(
    end: float, elapsed: float, *, rank: int = 0, scheduled: int = 1, running: int = 1, waiting: int = 0,
    drafted: int = 0, num_drafts: int = 0, ttft: Sequence[float] = (), finished: Sequence[str] = (),
) -> StepStats:  # fmt: skip
    return StepStats(
        rank=rank, end=end, elapsed_s=elapsed, scheduled=scheduled, prefills=0, decodes=scheduled, waiting=waiting,
        running=running, num_drafts=num_drafts, drafted=drafted, accepted=0, k_scheduled=2, batched_tokens=None,
        kv_tokens=None, first_token_latencies=list(ttft), finished=list(finished),
    )  # fmt: skip


# One rank busy for three steps, idle, then one more step; vLLM's elapsed is short, as under async scheduling
# where it times only the wait for the step's result.
BUSY_THEN_IDLE = [
    _step(10.000, 0.001),  # the rank's first step
    _step(10.050, 0.002),
    _step(10.100, 0.002, running=0),  # the last request finished: the rank goes idle
    _step(20.000, 0.003),  # after the idle gap
]


def _starts(timeline: StepTimeline, steps: Sequence[StepStats]) -> list[float]:
    for step in steps:
        timeline.record(step)
    return [round(s, 6) for s in timeline.since(0)["start"]]


def test_without_async_scheduling_a_step_starts_at_vllms_own_measure() -> None:
    starts = _starts(StepTimeline(speculative=False), BUSY_THEN_IDLE)
    assert starts == [9.999, 10.048, 10.098, 19.997]


def test_with_async_scheduling_a_busy_ranks_step_starts_where_its_previous_one_ended() -> None:
    starts = _starts(StepTimeline(speculative=False, async_scheduling=True), BUSY_THEN_IDLE)
    # Steps 2 and 3 follow a step that left work: consecutive outputs. Step 1 and the step after the idle gap
    # have no busy predecessor: vLLM's measure.
    assert starts == [9.999, 10.000, 10.050, 19.997]


def test_with_async_scheduling_waiting_requests_keep_a_rank_busy_and_ranks_do_not_mix() -> None:
    steps = [
        _step(1.00, 0.01, rank=0, running=0, waiting=3),  # nothing running, but work queued: busy
        _step(1.02, 0.01, rank=1),
        _step(1.05, 0.01, rank=0),
        _step(1.07, 0.01, rank=1),
    ]
    starts = _starts(StepTimeline(speculative=False, async_scheduling=True), steps)
    assert starts == [0.99, 1.01, 1.00, 1.02]


def _finished(timeline: StepTimeline, request_id: str) -> tuple[int, int]:
    where = asyncio.run(timeline.finished(request_id, timeout_s=1))
    assert where is not None
    return where


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_requests_steps_are_found_by_vllms_ttft_whatever_the_starts(async_scheduling: bool) -> None:
    timeline = StepTimeline(speculative=True, async_scheduling=async_scheduling)
    # Two requests on one rank; "a" gets its first token in step 1, "b" in step 2; k (drafts verified by the
    # next step) is 2 throughout; "a" finishes in step 4, "b" in step 5.
    steps = [
        _step(1.00, 0.5, scheduled=1),  # prefill of "a"
        _step(1.01, 0.5, scheduled=2, ttft=[0.25]),
        _step(1.02, 0.5, scheduled=2, ttft=[0.125], drafted=2, num_drafts=1),
        _step(1.03, 0.5, scheduled=2, drafted=4, num_drafts=2),
        _step(1.04, 0.5, scheduled=2, drafted=4, num_drafts=2, finished=["a"]),
        _step(1.05, 0.5, scheduled=1, running=0, drafted=2, num_drafts=1, finished=["b"]),
    ]
    for step in steps:
        timeline.record(step)
    rank, last = _finished(timeline, "a")
    assert (rank, last) == (0, 4)
    assert timeline.request_steps(0, last, first_token_latency=0.25, decode_steps=None) == ([2, 2, 2], [2, 2, 2])
    _, last_b = _finished(timeline, "b")
    assert timeline.request_steps(0, last_b, first_token_latency=0.125, decode_steps=None) == ([2, 2, 2], [2, 2, 2])
    assert timeline.fallbacks == {"first_step_by_count": 0, "first_step_unknown": 0, "finish_not_reported": 0}


def test_without_vllms_ttft_the_first_step_is_counted_back_or_left_unknown_never_guessed_by_time() -> None:
    timeline = StepTimeline(speculative=False, async_scheduling=True)
    for i in range(6):
        timeline.record(_step(1.0 + i / 100, 0.001, scheduled=3 if i < 3 else 1, finished=["x"] if i == 5 else ()))
    _, last = _finished(timeline, "x")
    # A speculation-off request of 4 tokens: its first token came 3 steps before its last.
    assert timeline.request_steps(0, last, first_token_latency=None, decode_steps=3) == ([3, 1, 1], [0, 0, 0])
    assert timeline.request_steps(0, last, first_token_latency=9.9, decode_steps=None) == ([], [])
    assert timeline.fallbacks == {"first_step_by_count": 1, "first_step_unknown": 1, "finish_not_reported": 0}
