"""vLLM's engine steps as a timeline: one row per step of each data-parallel rank, as the stat logger reports
it, and which steps each request was in (serve_apps/engines/vllm_stats.py feeds it; the engine reads it)."""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# How long a finished request waits for the stat logger to report the step that finished it. vLLM records that
# step in the same pass of its output handler that delivers the final output, so the wait is normally zero; it
# is only reached if stats stop arriving (then the request reports no steps rather than hanging).
FINISH_WAIT_S = 30.0
# Requests whose first step or finish was seen but that never asked for it (aborted): forget the oldest.
_MAX_PENDING = 50_000


@dataclass(frozen=True, slots=True)
class StepStats:
    """One engine step of one DP rank, as vLLM's stat logger reports it."""

    rank: int
    end: float  # specdrill clock, when the front end recorded the step's outputs
    elapsed_s: float  # the engine core's execution time of the step (0 when vLLM did not report it)
    scheduled: int  # requests scheduled in the step: the key of vLLM's schedule lookup
    prefills: int  # of which still in prefill (vLLM's context requests)
    decodes: int  # of which decoding: they carry the drafts of the rank's previous step
    waiting: int
    # Requests still running after the step (vLLM's num_running_reqs, finished ones removed): with `waiting`,
    # whether the rank went straight on to its next step
    running: int
    num_drafts: int  # requests that verified drafts in this step
    drafted: int  # draft tokens verified in this step
    accepted: int
    k_scheduled: int
    batched_tokens: int | None  # tokens computed in the step (vLLM's num_ctx_tokens + num_generation_tokens)
    # KV tokens the step read: kv_cache_usage x (num_gpu_blocks - 1) x block_size, sampled after the step; None
    # when a request finished in it (its blocks were already freed, so the sample undercounts what the step read)
    kv_tokens: int | None
    first_token_latencies: Sequence[float]  # vLLM's TTFT of each request whose first token came in this step
    finished: Sequence[str]  # request ids (as given to generate) that finished in this step
    finished_at_length: int = 0  # of which vLLM finished for length (max_tokens or max_model_len)


def drafts_unused(step: StepStats) -> bool:
    """vLLM 0.33+'s skip_drafts condition (scheduler.py _drafts_unused, 0.33:502-544), recomputed from what the
    stat logger reports, since no stat carries the scheduler's flag: every request scheduled in the step was on a
    non-final prefill chunk (a context request that got no first token) or finished in it for length. vLLM asks
    "sure to reach max_tokens" before the step; this asks "did" after it, so it also takes a step where accepted
    drafts (or max_model_len) ended a request: there too no scheduled request verifies the step's drafts, so the
    k the next step reports was never the step's (see StepTimeline's k)."""
    if step.scheduled <= 0:
        return False
    # Final prefill chunks sample a first token; they and the decoding requests need drafts unless they finished.
    return len(step.first_token_latencies) + step.decodes <= step.finished_at_length


class StepTimeline:
    """Every engine step of every DP rank, in the order the front end saw them (ranks interleave).

    Columns are those of the simulated engine's timeline (start, end, batch_size, k, drafted, accepted, waiting,
    num_prefill) plus dp_rank, num_drafts and k_scheduled:
    - start/end: end is when the front end recorded the step (after the IPC hop from the engine process and the
      step's detokenization: late by that lag, typically well under a millisecond here, more on a loaded host);
      start is end minus the engine core's own timing of the step (model forward, sampling and drafting; the
      scheduler's bookkeeping before and after is not in it). So the duration is the engine's, both ends are
      shifted later by the lag.
      With async scheduling (vLLM's default on GPU for EAGLE, draft-model and off arms: a batch queue of two, the
      next step launched before the current one's result is awaited) vLLM's elapsed time covers only the wait
      for the result (v1/engine/core.py step_with_batch_queue), not the step. There a step's start is the end
      of the same rank's previous step when that step left requests to run (running or waiting): the engine was
      busy throughout, so consecutive outputs of a rank are its steps' durations. A step after an idle rank (its
      first, or one after every request had finished) starts at vLLM's measure, as without async scheduling.
    - batch_size: requests scheduled in the step (vLLM's len(num_scheduled_tokens), the schedule's lookup key).
    - k: the draft length proposed at the end of this step, as the rank's NEXT step verified it (draft tokens
      verified per drafting request there; 0 when decoding requests verified none). vLLM reports drafts when
      they are verified, one step after the lookup chose k, so a step's k is filled in when its successor
      arrives; it stays None (unknown) when no request carried the step's drafts on (every request finished in
      it, or the next step held only prefills, or, under async scheduling, only prefills and requests that had
      finished in this step). A speculation-off engine has k = 0 throughout.
    - drafted/accepted/num_drafts: verified in this step (proposed by the previous one).
    - k_scheduled: the k vLLM's schedule lookup gives for batch_size under the engine's resolved config.
    - drafts_skipped (only where the engine can skip drafts: vLLM 0.33+, model runner V2, a drafter with its own
      forward pass): no request scheduled in the step could use the drafts proposed after it (drafts_unused), so
      vLLM proposed none (k = 0 whatever k_scheduled says). The column is absent for every other engine.
    - batched_tokens / kv_tokens: what the step computed (iteration details) and the KV blocks in use after it
      as tokens (block granularity, so up to block_size - 1 per request above the contexts); None without
      iteration details / before vLLM reported its block count, and kv_tokens None in a step where a request
      finished (vLLM samples usage after freeing its blocks, which would undercount what the step read).
    """

    COLUMNS = (
        "start", "end", "batch_size", "k", "drafted", "accepted", "waiting", "num_prefill", "num_drafts",
        "k_scheduled", "dp_rank", "batched_tokens", "kv_tokens",
    )  # fmt: skip

    def __init__(
        self, *, speculative: bool = True, async_scheduling: bool = False, can_skip_drafts: bool = False
    ) -> None:
        self._lock = threading.Lock()
        self.speculative = speculative
        # Set by the engine from its finalised config before the first step: adds the drafts_skipped column.
        self.can_skip_drafts = can_skip_drafts
        # Set by the engine from its finalised config before the first step (see the class doc).
        self.async_scheduling = async_scheduling
        self._busy_until: dict[int, float] = {}  # rank -> end of its last step, while that step left work
        self.rows: dict[str, list[Any]] = {c: [] for c in self.COLUMNS}
        self._rank_rows: dict[int, list[int]] = {}  # rank -> its row indices, ascending
        self._awaiting_k: dict[int, int] = {}  # rank -> its last row, whose k the next step will tell
        self._finished_last: dict[int, int] = {}  # rank -> requests reported finished in its latest step
        self._first_token: dict[tuple[int, float], int] = {}  # (rank, vLLM TTFT) -> row of the first token
        self._finished: dict[str, tuple[int, int]] = {}  # request id -> (rank, row of its last step)
        self._waiters: dict[str, asyncio.Future[tuple[int, int]]] = {}
        # Requests whose steps could not be found exactly (see request_steps and finished): 0 when all is well.
        self.fallbacks = {"first_step_by_count": 0, "first_step_unknown": 0, "finish_not_reported": 0}

    def record(self, step: StepStats) -> None:
        with self._lock:
            rows = self.rows
            previous = self._awaiting_k.pop(step.rank, None)
            # Under async scheduling this step was scheduled before the previous one's output was processed, so
            # the requests that finished there (by a stop token, or by max_tokens reached through accepted drafts)
            # ran in it again: vLLM counts them among its decoding requests and discards their output, drafts
            # included (scheduler.py update_from_output skips finished requests; docs/engineering/gpu-review.md). At
            # most that many of its decodes are such leftovers.
            leftovers = self._finished_last.get(step.rank, 0) if self.async_scheduling else 0
            self._finished_last[step.rank] = len(step.finished)
            if previous is not None:
                if step.num_drafts:
                    rows["k"][previous] = round(step.drafted / step.num_drafts)
                elif step.decodes > leftovers:
                    rows["k"][previous] = 0  # decoding requests came on and verified nothing: k was 0
            index = len(rows["end"])
            start = step_start(step, self._busy_until.get(step.rank), async_scheduling=self.async_scheduling)
            if step.running + step.waiting > 0:
                self._busy_until[step.rank] = step.end
            else:
                self._busy_until.pop(step.rank, None)
            for name, value in (
                ("start", start), ("end", step.end), ("batch_size", step.scheduled),
                ("k", None if self.speculative else 0), ("drafted", step.drafted), ("accepted", step.accepted),
                ("waiting", step.waiting), ("num_prefill", step.prefills), ("num_drafts", step.num_drafts),
                ("k_scheduled", step.k_scheduled), ("dp_rank", step.rank), ("batched_tokens", step.batched_tokens),
                ("kv_tokens", step.kv_tokens),
            ):  # fmt: skip
                rows[name].append(value)
            if self.can_skip_drafts:
                rows.setdefault("drafts_skipped", [False] * index).append(drafts_unused(step))
            self._rank_rows.setdefault(step.rank, []).append(index)
            if self.speculative:
                self._awaiting_k[step.rank] = index
            for latency in step.first_token_latencies:
                _bounded_put(self._first_token, (step.rank, latency), index)
            self._finish(step.finished, step.rank, index)

    def finish_at_latest(self, request_ids: Sequence[str], rank: int) -> None:
        """Requests vLLM reported finished with no step (outputs without scheduler stats): their last step is the
        rank's latest."""
        with self._lock:
            mine = self._rank_rows.get(rank)
            if mine:
                self._finish(request_ids, rank, mine[-1])
                self._finished_last[rank] = self._finished_last.get(rank, 0) + len(request_ids)

    def _finish(self, request_ids: Sequence[str], rank: int, row: int) -> None:
        for request_id in request_ids:
            waiter = self._waiters.pop(request_id, None)
            if waiter is None:
                _bounded_put(self._finished, request_id, (rank, row))
            else:
                # Thread-safe hand-over: vLLM 0.32 records stats on the engine's event loop, but nothing promises it.
                waiter.get_loop().call_soon_threadsafe(_settle, waiter, (rank, row))

    async def finished(self, request_id: str, *, timeout_s: float = FINISH_WAIT_S) -> tuple[int, int] | None:
        """(rank, row of the last step) of a finished request, from the step in which vLLM reported it finished."""
        with self._lock:
            where = self._finished.pop(request_id, None)
            if where is not None:
                return where
            waiter: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
            self._waiters[request_id] = waiter
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            with self._lock:
                self._waiters.pop(request_id, None)
                self.fallbacks["finish_not_reported"] += 1
            log.warning("no engine step reported request %s finished within %.0f s", request_id, timeout_s)
            return None

    def request_steps(
        self, rank: int, last_row: int, *, first_token_latency: float | None, decode_steps: int | None
    ) -> tuple[list[int], list[int]]:
        """(batch sizes, k) of the rank's steps whose drafts the request verified: from the step of its first
        token up to the one before its last (the last step's drafts are never verified by it). The first step is
        found by vLLM's TTFT of the request (the value its iteration stats carried in that step); without it, by
        counting back `decode_steps` of the rank's steps from the last (where the caller knows that count: one
        token a step without speculation). Never by time: under async scheduling a step's start is not vLLM's
        measure (see the class doc). Neither known: no steps, counted in fallbacks. Async scheduling moves
        neither end: vLLM 0.32-0.34 deliver a step's first tokens and finishes with that step's own stats
        (docs/engineering/gpu-review.md, "Async scheduling and the step timeline")."""
        with self._lock:
            mine = self._rank_rows.get(rank, [])
            hi = bisect.bisect_left(mine, last_row)
            first: int | None = None
            if first_token_latency is not None:
                # Not popped: two requests that arrived at the same instant share the key, and the step.
                first = self._first_token.get((rank, first_token_latency))
            if first is not None:
                lo = bisect.bisect_left(mine, first)
            elif decode_steps is not None:
                self.fallbacks["first_step_by_count"] += 1
                lo = max(0, hi - decode_steps)
            else:
                self.fallbacks["first_step_unknown"] += 1
                return [], []
            batch: list[int] = []
            ks: list[int] = []
            skipped = self.rows.get("drafts_skipped")
            for i in mine[lo:hi]:
                k = self.rows["k"][i]
                if k is None:  # nobody verified this step's drafts: its k is not known (see the class doc)
                    continue
                if skipped is not None and skipped[i]:  # vLLM proposed no drafts there by design (see drafts_unused)
                    continue
                batch.append(self.rows["batch_size"][i])
                ks.append(k)
            return batch, ks

    def since(self, index: int) -> dict[str, list[Any]]:
        with self._lock:
            return {c: list(v[index:]) for c, v in self.rows.items()}

    def last(self, rank: int) -> dict[str, float]:
        """The rank's latest step (batch size, queue) and its latest known k, for live gauges."""
        with self._lock:
            mine = self._rank_rows.get(rank, [])
            if not mine:
                return {"running": 0.0, "waiting": 0.0, "k": 0.0}
            known = next((self.rows["k"][i] for i in reversed(mine) if self.rows["k"][i] is not None), 0)
            return {
                "running": float(self.rows["batch_size"][mine[-1]]),
                "waiting": float(self.rows["waiting"][mine[-1]]),
                "k": float(known),
            }

    def __len__(self) -> int:
        return len(self.rows["end"])


def step_start(step: StepStats, previous_busy_end: float | None, *, async_scheduling: bool) -> float:
    """When the step started (see StepTimeline): the end of the rank's previous step if async scheduling is on
    and that step left work, else the end minus vLLM's own timing of the step."""
    if async_scheduling and previous_busy_end is not None:
        return previous_busy_end
    return step.end - step.elapsed_s


def _settle(waiter: asyncio.Future[tuple[int, int]], where: tuple[int, int]) -> None:
    if not waiter.done():
        waiter.set_result(where)


def _bounded_put(table: dict[Any, Any], key: Any, value: Any) -> None:
    table[key] = value
    if len(table) > _MAX_PENDING:
        del table[next(iter(table))]
