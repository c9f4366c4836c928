"""vLLM's step timeline (serve_apps/engines/step_timeline.py StepTimeline) from synthetic stat-logger steps: when a
step started, with and without async scheduling, and which steps a request was in, found without timing."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from serve_apps.engines.step_timeline import StepStats, StepTimeline
from serve_apps.vllm_versions import SUPPORTED, minor_text


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


# --- Async scheduling: the order vLLM 0.32-0.34 deliver a step's stats (docs/engineering/gpu-review.md, "Async
# scheduling and the step timeline"). With a batch queue of two, EngineCore.step_with_batch_queue schedules step N+1
# before it pops step N and hands N's own SchedulerOutput to capture_iteration_details and update_from_output; the
# latter puts N's finishes and N's stats (make_stats, spec-decode stats of N's verified drafts) in one
# EngineCoreOutputs, and AsyncLLM's output handler builds one IterationStats (TTFTs, finished requests) from those
# outputs and records it with those stats. So a step's first tokens and finishes come with that step's own stats, in
# both modes. What differs: step N+1 was scheduled before N's finishes were known, so a request that finished in N runs
# in N+1 again, counted among its decodes (generation requests by its placeholders), its output and drafts discarded
# (update_from_output skips finished requests). Read at these lines, the same order in each version:
DELIVERY_READ = {
    "0.32": "core.py:753-759,768-786 scheduler.py:2091,2116-2129,2227,2409-2422 async_llm.py:853-902",
    "0.33": "core.py:763-769,778-796 scheduler.py:2327,2352-2365,2473,2661-2674 async_llm.py:884-933",
    "0.34": "core.py:813-819,828-846 scheduler.py:2373,2398-2411,2538,2728-2741 async_llm.py:898-947",
}


def _two_requests_under_async_scheduling() -> list[StepStats]:
    """The records one rank's stat logger gets, in delivery order, for: S0 prefills "a" (its first token); S1
    decodes "a" (2 drafts) and prefills "b" (its first token); S2 decodes both (2 drafts each), "a" samples a stop
    token; S3 runs "a" again (scheduled before S2's output was processed) and "b", which samples its stop token;
    S4 runs only "b" again. `running` is read after the next step was scheduled (make_stats in update_from_output)."""

    def step(end: float, scheduled: int, prefills: int, running: int, drafted: int, num_drafts: int,
             ttft: Sequence[float] = (), finished: Sequence[str] = ()) -> StepStats:  # fmt: skip
        return StepStats(
            rank=0, end=end, elapsed_s=0.001, scheduled=scheduled, prefills=prefills, decodes=scheduled - prefills,
            waiting=0, running=running, num_drafts=num_drafts, drafted=drafted, accepted=0, k_scheduled=2,
            batched_tokens=None, kv_tokens=None, first_token_latencies=list(ttft), finished=list(finished),
        )  # fmt: skip

    return [
        step(1.00, 1, 1, running=2, drafted=0, num_drafts=0, ttft=[0.25]),  # S0
        step(1.01, 2, 1, running=2, drafted=2, num_drafts=1, ttft=[0.125]),  # S1
        step(1.02, 2, 0, running=1, drafted=4, num_drafts=2, finished=["a"]),  # S2: "a" is in S3 already
        step(1.03, 2, 0, running=0, drafted=2, num_drafts=1, finished=["b"]),  # S3: "a"'s rerun verified nothing
        step(1.04, 1, 0, running=0, drafted=0, num_drafts=0),  # S4: only "b"'s rerun
    ]


def test_the_delivery_order_was_read_in_every_supported_vllm() -> None:
    """The records below are one delivery order for every version: a minor added to serve_apps/vllm_versions.py
    without its order read into DELIVERY_READ (and the records changed where it differs) fails here. (Until issue 40
    the next test was parametrized over DELIVERY_READ's versions and never used the parameter.)"""
    assert sorted(DELIVERY_READ) == [minor_text(m) for m in sorted(SUPPORTED)]


def test_under_async_scheduling_a_request_gets_the_steps_that_computed_its_first_and_last_tokens() -> None:
    timeline = StepTimeline(speculative=True, async_scheduling=True)
    for step in _two_requests_under_async_scheduling():
        timeline.record(step)
    # "a": first token in S0 (row 0), last in S2 (row 2), whose row is the batch of two that computed it, not S3.
    _, last_a = _finished(timeline, "a")
    assert last_a == 2 and timeline.rows["batch_size"][last_a] == 2
    assert timeline.request_steps(0, last_a, first_token_latency=0.25, decode_steps=None) == ([1, 2], [2, 2])
    _, last_b = _finished(timeline, "b")
    assert last_b == 3
    assert timeline.request_steps(0, last_b, first_token_latency=0.125, decode_steps=None) == ([2, 2], [2, 2])
    # S3's drafts were verified only by "b"'s discarded rerun in S4: unknown, not 0 (S4's one decode is that rerun).
    assert timeline.rows["k"] == [2, 2, 2, None, None]
    assert timeline.fallbacks == {"first_step_by_count": 0, "first_step_unknown": 0, "finish_not_reported": 0}


def test_under_async_scheduling_decodes_beyond_the_reruns_that_verified_nothing_still_mean_k_0() -> None:
    steps = _two_requests_under_async_scheduling()
    # S4 also decodes "c" (say, a request S3 had in prefill), and no request verified drafts: S3 proposed none.
    steps[-1] = replace(steps[-1], scheduled=2, decodes=2, running=1)
    timeline = StepTimeline(speculative=True, async_scheduling=True)
    for step in steps:
        timeline.record(step)
    assert timeline.rows["k"][3] == 0


def test_without_async_scheduling_a_decode_that_verified_nothing_means_k_0() -> None:
    # vLLM's EngineCore.step schedules a step after the previous one's output was processed (core.py 0.32:657-687,
    # 0.33:667-697, 0.34:713-743): the next step holds no finished request, so its decodes came on with no drafts.
    timeline = StepTimeline(speculative=True, async_scheduling=False)
    for step in _two_requests_under_async_scheduling():
        timeline.record(step)
    assert timeline.rows["k"] == [2, 2, 2, 0, None]


def _function(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    assert found, f"{path}: no function {name}"
    return cast(ast.FunctionDef, found[0])


def _calls(node: ast.AST, attribute: str) -> list[ast.Call]:
    return [
        n for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attribute
    ]  # fmt: skip


@pytest.mark.vllm
def test_the_installed_vllm_delivers_a_step_with_its_own_stats_under_async_scheduling() -> None:
    """The order DELIVERY_READ pins, read off the installed vLLM's source (not imported): fails the day a version
    hands a step's outputs to the stats of another step."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent / "v1"
    queue = _function(root / "engine" / "core.py", "step_with_batch_queue")
    popped = [
        n.targets[0].elts[1].id for n in ast.walk(queue)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute)
        and n.value.func.attr == "pop" and isinstance(n.targets[0], ast.Tuple)
        and isinstance(n.targets[0].elts[1], ast.Name)
    ]  # fmt: skip
    assert len(popped) == 1, "step_with_batch_queue no longer pops (future, scheduler_output, ...) once"
    for attribute in ("capture_iteration_details", "update_from_output"):
        args = [c.args[0] for c in _calls(queue, attribute)]
        assert [a.id for a in args if isinstance(a, ast.Name)] == popped, f"{attribute} is not given the popped step"
    update = _function(root / "core" / "sched" / "scheduler.py", "update_from_output")
    assert _calls(update, "make_stats"), "update_from_output no longer makes the stats it returns"
    assert any(
        isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Attribute) and n.targets[0].attr == "scheduler_stats"
        for n in ast.walk(update)
    ), "update_from_output no longer attaches its stats to the outputs it returns"  # fmt: skip
    handler = _function(root / "engine" / "async_llm.py", "output_handler")
    (record,) = _calls(handler, "record")
    given = {k.arg: ast.unparse(k.value) for k in record.keywords}
    assert given["scheduler_stats"] == "outputs.scheduler_stats" and given["iteration_stats"] == "iteration_stats"
    assert all("iteration_stats" in map(ast.unparse, c.args) for c in _calls(handler, "process_outputs"))
