"""The simulated engine's core: vLLM-style continuous batching with speculative decoding, clock-agnostic.

`EngineCore.run_steps(now, ...)` schedules and executes engine steps starting at `now` and returns when they
end; the virtual-time and real-time drivers decide what "now" is. State changes are decided at a step's start
and become visible at its end (tokens carry the step's end time).

Scheduling follows vLLM's V1 scheduler: running requests first (decode: 1 + pending drafts; unfinished prefill:
a chunk of what is left of the token budget), then waiting requests FCFS while max_num_seqs, the token budget
and KV blocks allow. When KV blocks run out a running request is preempted (recompute: it re-enters the front
of the queue and later prefills prompt + output again). The k for a step comes from the number of requests
scheduled in it (vLLM's dynamic_sd_lookup[len(num_scheduled_tokens)]); the drafter proposes that many tokens at
the end of the step, and the next step verifies them. Each request accepts a prefix of its drafts with
per-position probabilities of its workload category and emits accepted + 1 tokens.

Stretches where the batch does not change (every running request decoding, nobody admissible) are executed as
one vectorised window of up to `max_window` steps; the window ends at the first step in which a request
finishes or a known arrival happens, so the result is the same as stepping one by one.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from serve_apps.policies import ResolvedSpeculation
from serve_apps.sim.costs import step_seconds
from serve_apps.sim.profile import Profile
from serve_apps.sim.request import RequestRecord, SimRequest


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What a call to run_steps did: the time its last step ends, and per-request emitted tokens by step."""

    end: float
    step_ends: np.ndarray
    emitted: dict[SimRequest, np.ndarray]  # tokens emitted per committed step (same length as step_ends)
    finished: list[SimRequest]


class StepTable:
    """Every executed engine step: the per-engine timeline (batch size against executed k over time)."""

    COLUMNS = (
        "start", "end", "batch_size", "num_prefill", "k", "batched_tokens", "kv_tokens",
        "drafted", "accepted", "waiting", "running", "preempted",
    )  # fmt: skip

    def __init__(self) -> None:
        self._chunks: dict[str, list[np.ndarray]] = {c: [] for c in self.COLUMNS}
        self.count = 0

    def append(self, **columns: np.ndarray) -> np.ndarray:
        n = len(columns["start"])
        for name in self.COLUMNS:
            self._chunks[name].append(np.asarray(columns[name]))
        index = np.arange(self.count, self.count + n, dtype=np.int64)
        self.count += n
        return index

    def column(self, name: str) -> np.ndarray:
        chunks = self._chunks[name]
        if len(chunks) > 1:
            chunks[:] = [np.concatenate(chunks)]
        return chunks[0] if chunks else np.zeros(0)

    def as_dict(self) -> dict[str, np.ndarray]:
        return {c: self.column(c) for c in self.COLUMNS}


class EngineCore:
    def __init__(
        self,
        profile: Profile,
        speculation: ResolvedSpeculation,
        *,
        seed: int,
        engine_id: str = "engine-0",
        max_window: int = 256,
    ) -> None:
        self.profile = profile
        self.speculation = speculation
        self.engine_id = engine_id
        self.limits = profile.limits
        self.speculative = speculation.method is not None
        self.max_k = speculation.num_speculative_tokens
        self.k_table = speculation.k_table(self.limits.max_num_seqs)
        self.max_window = max_window
        self.rng = np.random.default_rng(seed)
        self.total_blocks = self.limits.kv_cache_tokens // self.limits.block_size
        self.free_blocks = self.total_blocks
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.steps = StepTable()
        self.num_preemptions = 0
        self._categories: dict[str, int] = {}
        self._cdf = np.zeros((0, self.max_k + 1))
        self._avail = np.zeros(0)

    # --- requests -------------------------------------------------------------------------------------------
    def add_request(self, request: SimRequest) -> None:
        if request.prompt_tokens < 1 or request.max_tokens < 1:
            raise ValueError(f"request {request.request_id}: prompt_tokens and max_tokens must be >= 1")
        needed = self._blocks_for(request.prompt_tokens + request.max_tokens + self.max_k)
        if needed > self.total_blocks:
            raise ValueError(
                f"request {request.request_id}: needs {needed} KV blocks, the engine has {self.total_blocks}"
            )
        request.cat_index = self._category_index(request.category)
        request.prefill_goal = request.prompt_tokens
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _category_index(self, category: str) -> int:
        index = self._categories.get(category)
        if index is not None:
            return index
        acceptance = self.profile.acceptance_for(category)
        # P(accepted prefix >= j) = p_1 * ... * p_j; cdf[j] = P(prefix <= j).
        survive = np.cumprod([acceptance.prob(i) for i in range(self.max_k)]) if self.max_k else np.zeros(0)
        pmf_ge = np.concatenate([[1.0], survive])
        pmf = pmf_ge - np.concatenate([pmf_ge[1:], [0.0]])
        self._cdf = np.vstack([self._cdf, np.cumsum(pmf)[None, :]])
        self._avail = np.append(self._avail, acceptance.draft_availability)
        index = self._categories[category] = len(self._categories)
        return index

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.limits.block_size)

    def _grow(self, request: SimRequest, tokens_after: int) -> bool:
        extra = self._blocks_for(tokens_after) - request.blocks
        if extra <= 0:
            return True
        if extra > self.free_blocks:
            return False
        self.free_blocks -= extra
        request.blocks += extra
        return True

    def _release(self, request: SimRequest) -> None:
        self.free_blocks += request.blocks
        request.blocks = 0

    # --- stepping -------------------------------------------------------------------------------------------
    def run_steps(self, now: float, *, next_arrival: float = math.inf, max_steps: int | None = None) -> StepOutcome:
        """Run one scheduling step, or a window of identical-batch decode steps; return what happened."""
        limit = self.max_window if max_steps is None else max_steps
        if limit > 1 and self.running:
            # Every step emits at least one token per request, so the first finish comes within min(remaining)
            # steps; a step lasts at least its no-draft cost, which bounds the steps before the next arrival.
            limit = min(limit, min(r.target_tokens - r.output for r in self.running))
            if math.isfinite(next_arrival):
                kv = sum(r.computed for r in self.running)
                batch = len(self.running)
                shortest = float(
                    step_seconds(
                        self.profile, kv_tokens=np.array([kv]), batched_tokens=np.array([batch]),
                        k=0, batch_size=batch, speculative=False,
                    )[0]
                )  # fmt: skip
                limit = min(limit, max(1, math.ceil((next_arrival - now) / shortest) + 1))
        if limit > 1 and self._can_window(limit):
            return self._decode_window(now, next_arrival, limit)
        return self._single_step(now)

    def abort(self, request: SimRequest) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.running:
            self.running.remove(request)
            self._release(request)

    def _can_window(self, n: int) -> bool:
        if not self.running or any(r.in_prefill for r in self.running):
            return False
        if self.waiting and len(self.running) < self.limits.max_num_seqs:
            return False
        # Room for every running request to take n full-length steps without touching the allocator.
        k_max = max(self.max_k, max(r.pending_drafts for r in self.running))
        worst = sum(max(0, self._blocks_for(r.computed + n * (k_max + 1) + k_max) - r.blocks) for r in self.running)
        return worst <= self.free_blocks

    def _schedule(self) -> tuple[list[tuple[SimRequest, int]], int]:
        budget = self.limits.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        preempted = 0
        queue = list(self.running)
        i = 0
        while i < len(queue):
            request = queue[i]
            if request.in_prefill:
                tokens = min(request.prefill_goal - request.computed, budget)
            else:
                tokens = 1 + request.pending_drafts
            if tokens <= 0 or tokens > budget:
                i += 1
                continue
            while not self._grow(request, request.computed + tokens):
                victim = queue.pop()  # lowest priority: the most recently admitted
                self._preempt(victim)
                preempted += 1
                if victim is request:
                    break
            else:
                scheduled.append((request, tokens))
                budget -= tokens
                i += 1
        self.running = queue
        if preempted == 0:
            while self.waiting and len(self.running) < self.limits.max_num_seqs and budget > 0:
                request = self.waiting[0]
                tokens = min(request.prefill_goal - request.computed, budget)
                if not self._grow(request, request.computed + tokens):
                    break
                self.waiting.popleft()
                self.running.append(request)
                scheduled.append((request, tokens))
                budget -= tokens
        return scheduled, preempted

    def _preempt(self, request: SimRequest) -> None:
        self._release(request)
        request.computed = 0
        request.prefill_goal = request.prompt_tokens + request.output
        request.pending_drafts = 0
        request.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _k_for(self, batch_size: int) -> int:
        return self.k_table[min(batch_size, self.limits.max_num_seqs)] if self.speculative else 0

    def _sample_prefix(self, cat: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        """Accepted-prefix lengths among max_k drafts: shape (steps, requests)."""
        if self.max_k == 0:
            return np.zeros(shape, dtype=np.int64)
        u = self.rng.random(shape)
        cdf = self._cdf[cat]  # (B, max_k + 1)
        prefix: np.ndarray = (u[..., None] >= cdf[None, :, : self.max_k]).sum(axis=-1)
        return prefix

    def _propose(self, cat: np.ndarray, k: int, shape: tuple[int, ...]) -> np.ndarray:
        if k == 0:
            return np.zeros(shape, dtype=np.int64)
        available = self.rng.random(shape) < self._avail[cat]
        return np.where(available, k, 0)

    def _single_step(self, now: float) -> StepOutcome:
        scheduled, preempted = self._schedule()
        if not scheduled:
            return StepOutcome(now, np.zeros(0), {}, [])
        batch = len(scheduled)
        k = self._k_for(batch)
        requests = [r for r, _ in scheduled]
        tokens = np.array([t for _, t in scheduled], dtype=np.int64)
        decoding = np.array([not r.in_prefill for r in requests])
        drafted = np.array([r.pending_drafts if d else 0 for r, d in zip(requests, decoding, strict=True)])
        cat = np.array([r.cat_index for r in requests], dtype=np.int64)
        kv = int(sum(r.computed for r in requests) + tokens.sum())
        duration = float(
            step_seconds(
                self.profile, kv_tokens=np.array([kv]), batched_tokens=np.array([tokens.sum()]),
                k=k, batch_size=batch, speculative=self.speculative,
            )[0]
        )  # fmt: skip
        end = now + duration
        accepted = np.minimum(self._sample_prefix(cat, (1, batch))[0], drafted)
        proposals = self._propose(cat, k, (batch,))
        emitted = np.zeros(batch, dtype=np.int64)
        for i, request in enumerate(requests):
            if request.first_scheduled is None:
                request.first_scheduled = now
            if decoding[i]:
                request.computed += 1 + int(accepted[i])
                emitted[i] = min(1 + int(accepted[i]), request.target_tokens - request.output)
            else:
                request.computed += int(tokens[i])
                emitted[i] = 0 if request.in_prefill else 1  # the last prefill chunk samples a token
        index = self.steps.append(
            start=np.array([now]), end=np.array([end]), batch_size=np.array([batch]),
            num_prefill=np.array([int((~decoding).sum())]), k=np.array([k]),
            batched_tokens=np.array([int(tokens.sum())]), kv_tokens=np.array([kv]),
            drafted=np.array([int(drafted.sum())]), accepted=np.array([int(accepted.sum())]),
            waiting=np.array([len(self.waiting)]), running=np.array([len(self.running)]),
            preempted=np.array([preempted]),
        )  # fmt: skip
        finished = []
        per_request: dict[SimRequest, np.ndarray] = {}
        for i, request in enumerate(requests):
            request.record(index, drafted[i : i + 1], accepted[i : i + 1], emitted[i : i + 1])
            per_request[request] = emitted[i : i + 1]
            if emitted[i]:
                request.output += int(emitted[i])
                if request.first_token is None:
                    request.first_token = end
            if request.output >= request.target_tokens:
                self._finish(request, end)
                finished.append(request)
            elif not request.in_prefill:
                request.pending_drafts = int(proposals[i])
        return StepOutcome(end, np.array([end]), per_request, finished)

    def _decode_window(self, now: float, next_arrival: float, n: int) -> StepOutcome:
        requests = list(self.running)  # _finish removes from self.running while we walk the batch
        batch = len(requests)
        k = self._k_for(batch)
        cat = np.array([r.cat_index for r in requests], dtype=np.int64)
        pending = np.array([r.pending_drafts for r in requests], dtype=np.int64)
        remaining = np.array([r.target_tokens - r.output for r in requests], dtype=np.int64)
        computed = np.array([r.computed for r in requests], dtype=np.int64)

        drafted = np.empty((n, batch), dtype=np.int64)
        drafted[0] = pending
        drafted[1:] = self._propose(cat, k, (n - 1, batch))
        accepted = np.minimum(self._sample_prefix(cat, (n, batch)), drafted)
        gained = 1 + accepted
        cum = np.cumsum(gained, axis=0)
        # A request finishes in the first step where its cumulative output reaches what it has left.
        done = cum >= remaining[None, :]
        finish_step = np.where(done.any(axis=0), done.argmax(axis=0), n)
        batched = batch + drafted.sum(axis=1)
        kv_before = computed.sum() + np.concatenate([[0], cum.sum(axis=1)[:-1]])
        durations = step_seconds(
            self.profile, kv_tokens=kv_before + batched, batched_tokens=batched,
            k=k, batch_size=batch, speculative=self.speculative,
        )  # fmt: skip
        ends = now + np.cumsum(durations)
        last = min(int(finish_step.min()), n - 1)
        if next_arrival < ends[last]:
            last = min(last, int(np.searchsorted(ends, next_arrival, side="left")))
        m = last + 1
        ends = ends[:m]
        starts = np.concatenate([[now], ends[:-1]])
        drafted, accepted, gained = drafted[:m], accepted[:m], gained[:m]
        index = self.steps.append(
            start=starts, end=ends, batch_size=np.full(m, batch), num_prefill=np.zeros(m, dtype=np.int64),
            k=np.full(m, k), batched_tokens=batched[:m], kv_tokens=(kv_before + batched)[:m],
            drafted=drafted.sum(axis=1), accepted=accepted.sum(axis=1),
            waiting=np.full(m, len(self.waiting)), running=np.full(m, batch), preempted=np.zeros(m, dtype=np.int64),
        )  # fmt: skip
        next_drafts = self._propose(cat, k, (batch,))
        finished: list[SimRequest] = []
        per_request: dict[SimRequest, np.ndarray] = {}
        for i, request in enumerate(requests):
            steps_taken = min(m, int(finish_step[i]) + 1)
            emitted = gained[:steps_taken, i].copy()
            emitted[-1] -= max(0, int(emitted.sum()) - int(remaining[i]))
            request.record(index[:steps_taken], drafted[:steps_taken, i], accepted[:steps_taken, i], emitted)
            per_request[request] = emitted
            request.computed += int(gained[:steps_taken, i].sum())
            request.output += int(emitted.sum())
            if request.output >= request.target_tokens:
                self._finish(request, float(ends[steps_taken - 1]))
                finished.append(request)
            else:
                request.pending_drafts = int(next_drafts[i])
        return StepOutcome(float(ends[-1]), ends, per_request, finished)

    def _finish(self, request: SimRequest, when: float) -> None:
        request.finished_at = when
        request.finish_reason = "length" if request.output >= request.max_tokens else "stop"
        request.pending_drafts = 0
        self._release(request)
        self.running.remove(request)

    # --- records --------------------------------------------------------------------------------------------
    def record_for(self, request: SimRequest) -> RequestRecord:
        if not request.finished:
            raise ValueError(f"request {request.request_id} has not finished")
        history = request.history()
        ends = self.steps.column("end")
        batch = self.steps.column("batch_size")
        ks = self.steps.column("k")
        steps = history["step"]
        assert request.first_scheduled is not None and request.first_token is not None
        assert request.finished_at is not None and request.finish_reason is not None
        return RequestRecord(
            request_id=request.request_id,
            category=request.category,
            prompt_tokens=request.prompt_tokens,
            output_tokens=request.output,
            max_tokens=request.max_tokens,
            finish_reason=request.finish_reason,
            arrival=request.arrival,
            first_scheduled=request.first_scheduled,
            first_token=request.first_token,
            finished=request.finished_at,
            preemptions=request.preemptions,
            token_times=np.repeat(ends[steps], history["emitted"]),
            step_batch_size=batch[steps].astype(np.int64),
            step_k=ks[steps].astype(np.int64),
            step_drafted=history["drafted"],
            step_accepted=history["accepted"],
            num_spec_tokens=self.max_k,
        )
