"""The simulated engine's core: vLLM-style continuous batching with speculative decoding, clock-agnostic.

`EngineCore.run_steps(now, ...)` schedules and executes engine steps starting at `now` and returns when they
end; the virtual-time and real-time drivers decide what "now" is. State changes are decided at a step's start
and become visible at its end (tokens carry the step's end time).

Scheduling follows vLLM's V1 scheduler: running requests first (decode: 1 + pending drafts; unfinished
prefill: a chunk of what is left of the token budget), then waiting requests FCFS while max_num_seqs, the
token budget and KV blocks allow. When KV blocks run out a running request is preempted (recompute: it
re-enters the front of the queue and later prefills prompt + output again). The k for a step comes from the
number of requests scheduled in it (vLLM's dynamic_sd_lookup[len(num_scheduled_tokens)]); the drafter proposes
that many tokens at the end of the step, and the next step verifies them. Each request accepts a prefix of its
drafts with per-position probabilities of its workload category and emits accepted + 1 tokens.

Running requests live in slot arrays so a step costs a handful of numpy operations whatever the batch size.
Stretches where the batch does not change (every running request decoding, nobody admissible) run as one
vectorised window of up to `max_window` steps; the window ends at the first step in which a request finishes
or a known arrival happens, so the result is the same as stepping one by one.
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

I64 = np.int64


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one call to run_steps did. emitted[j, i] = tokens request uids[i] got at the end of step j."""

    end: float
    step_ends: np.ndarray
    uids: np.ndarray
    emitted: np.ndarray
    finished: list[SimRequest]


class _Chunks:
    """Append-only columns kept as a list of chunks, concatenated on demand."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self._chunks: dict[str, list[np.ndarray]] = {c: [] for c in columns}
        self.count = 0  # rows
        self.appends = 0  # chunks

    def append(self, **data: np.ndarray) -> None:
        for name in self.columns:
            self._chunks[name].append(data[name])
        self.count += len(data[self.columns[0]])
        self.appends += 1

    def column(self, name: str, first_chunk: int = 0) -> np.ndarray:
        chunks = self._chunks[name][first_chunk:]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=I64)


class StepTable(_Chunks):
    """Every executed engine step: the per-engine timeline (batch size against executed k over time)."""

    COLUMNS = (
        "start", "end", "batch_size", "num_prefill", "k", "batched_tokens", "kv_tokens",
        "drafted", "accepted", "waiting", "running", "preempted",
    )  # fmt: skip

    def __init__(self) -> None:
        super().__init__(self.COLUMNS)
        self._cache: dict[str, tuple[int, np.ndarray]] = {}

    def column(self, name: str, first_chunk: int = 0) -> np.ndarray:
        if first_chunk:
            return super().column(name, first_chunk)
        cached = self._cache.get(name)
        if cached is None or cached[0] != self.appends:
            cached = (self.appends, super().column(name))
            self._cache[name] = cached
        return cached[1]

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
        self.k_table = np.asarray(speculation.k_table(self.limits.max_num_seqs), dtype=I64)
        self.max_window = max_window
        self.rng = np.random.default_rng(seed)
        self.total_blocks = self.limits.kv_cache_tokens // self.limits.block_size
        self.free_blocks = self.total_blocks
        self.waiting: deque[SimRequest] = deque()
        self.steps = StepTable()
        self.log = _Chunks(("uid", "step", "drafted", "accepted", "emitted"))
        self.num_preemptions = 0
        self._categories: dict[str, int] = {}
        self._cdf = np.zeros((0, self.max_k + 1))
        self._avail = np.zeros(0)
        self._next_uid = 0
        # Slot arrays for running requests; `run` lists occupied slots in scheduling (admission) order.
        n = self.limits.max_num_seqs
        self.s_computed = np.zeros(n, dtype=I64)
        self.s_output = np.zeros(n, dtype=I64)
        self.s_target = np.zeros(n, dtype=I64)
        self.s_goal = np.zeros(n, dtype=I64)  # tokens to prefill before decoding
        self.s_pending = np.zeros(n, dtype=I64)  # drafts proposed last step, verified next step
        self.s_blocks = np.zeros(n, dtype=I64)
        self.s_cat = np.zeros(n, dtype=I64)
        self.s_uid = np.zeros(n, dtype=I64)
        self.s_request: list[SimRequest | None] = [None] * n
        self.free_slots = list(range(n - 1, -1, -1))
        self.run = np.zeros(0, dtype=I64)

    # --- requests -------------------------------------------------------------------------------------------
    @property
    def running(self) -> list[SimRequest]:
        return [r for r in (self.s_request[s] for s in self.run) if r is not None]

    def add_request(self, request: SimRequest) -> None:
        if request.prompt_tokens < 1 or request.max_tokens < 1:
            raise ValueError(f"request {request.request_id}: prompt_tokens and max_tokens must be >= 1")
        needed = self._blocks_for(request.prompt_tokens + request.max_tokens + self.max_k)
        if needed > self.total_blocks:
            raise ValueError(
                f"request {request.request_id}: needs {needed} KV blocks, the engine has {self.total_blocks}"
            )
        self._category_index(request.category)
        request.uid = self._next_uid
        self._next_uid += 1
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting) or len(self.run) > 0

    def abort(self, request: SimRequest) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
            return
        for slot in self.run:
            if self.s_request[slot] is request:
                self._vacate(int(slot))
                self.run = self.run[self.run != slot]
                return

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
        return -(-tokens // self.limits.block_size)

    def _occupy(self, request: SimRequest, now: float) -> int:
        slot = self.free_slots.pop()
        self.s_request[slot] = request
        self.s_computed[slot] = 0
        self.s_output[slot] = request.output
        self.s_target[slot] = request.target_tokens
        self.s_goal[slot] = request.prompt_tokens + request.output  # after a preemption: recompute the output too
        self.s_pending[slot] = 0
        self.s_blocks[slot] = 0
        self.s_cat[slot] = self._categories[request.category]
        self.s_uid[slot] = request.uid
        if request.first_scheduled is None:
            request.first_scheduled = now
            request.first_chunk = self.log.appends
        return slot

    def _vacate(self, slot: int) -> SimRequest:
        request = self.s_request[slot]
        assert request is not None
        request.output = int(self.s_output[slot])
        request.computed = int(self.s_computed[slot])
        self.free_blocks += int(self.s_blocks[slot])
        self.s_blocks[slot] = 0
        self.s_request[slot] = None
        self.free_slots.append(slot)
        return request

    # --- stepping -------------------------------------------------------------------------------------------
    def run_steps(self, now: float, *, next_arrival: float = math.inf, max_steps: int | None = None) -> StepOutcome:
        """Run one scheduling step, or a window of identical-batch decode steps; return what happened."""
        limit = self.max_window if max_steps is None else max_steps
        run = self.run
        if limit > 1 and len(run) and not (self.s_computed[run] < self.s_goal[run]).any():
            if not self.waiting or len(run) >= self.limits.max_num_seqs:
                # Each step emits >= 1 token per request, so the first finish comes within min(remaining) steps;
                # a step lasts at least its draft-free cost, which bounds the steps before the next arrival.
                limit = min(limit, int((self.s_target[run] - self.s_output[run]).min()))
                if math.isfinite(next_arrival):
                    kv = int(self.s_computed[run].sum())
                    shortest = float(
                        step_seconds(
                            self.profile, kv_tokens=np.array([kv]), batched_tokens=np.array([len(run)]),
                            k=0, batch_size=len(run), speculative=False,
                        )[0]
                    )  # fmt: skip
                    limit = min(limit, max(1, math.ceil((next_arrival - now) / shortest) + 1))
                if limit > 1 and self._room_for(limit):
                    return self._decode_window(now, next_arrival, limit)
        return self._single_step(now)

    def _room_for(self, n: int) -> bool:
        """Enough free KV blocks for every running request to take n full-length steps."""
        run = self.run
        k_max = max(self.max_k, int(self.s_pending[run].max()))
        tokens = self.s_computed[run] + n * (k_max + 1) + k_max
        extra = -(-tokens // self.limits.block_size) - self.s_blocks[run]
        return int(np.maximum(extra, 0).sum()) <= self.free_blocks

    def _k_for(self, batch_size: int) -> int:
        return int(self.k_table[min(batch_size, self.limits.max_num_seqs)]) if self.speculative else 0

    def _sample_prefix(self, cat: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        """Accepted-prefix lengths among max_k drafts: shape (steps, requests)."""
        if self.max_k == 0:
            return np.zeros(shape, dtype=I64)
        u = self.rng.random(shape)
        cdf = self._cdf[cat]  # (B, max_k + 1)
        prefix: np.ndarray = (u[..., None] >= cdf[None, :, : self.max_k]).sum(axis=-1)
        return prefix

    def _propose(self, cat: np.ndarray, k: int, shape: tuple[int, ...]) -> np.ndarray:
        if k == 0:
            return np.zeros(shape, dtype=I64)
        available = self.rng.random(shape) < self._avail[cat]
        return np.where(available, k, 0)

    def _schedule(self, now: float) -> tuple[np.ndarray, np.ndarray, int]:
        """Pick this step's requests and their token counts; grow their KV; admit from the queue."""
        run = self.run
        budget = self.limits.max_num_batched_tokens
        bs = self.limits.block_size
        prefilling = self.s_computed[run] < self.s_goal[run]
        want = np.where(prefilling, self.s_goal[run] - self.s_computed[run], 1 + self.s_pending[run])
        extra = np.maximum(-(-(self.s_computed[run] + want) // bs) - self.s_blocks[run], 0)
        preempted = 0
        if want.sum() <= budget and extra.sum() <= self.free_blocks:
            tokens = want
            self.s_blocks[run] += extra
            self.free_blocks -= int(extra.sum())
        else:
            tokens, preempted = self._schedule_constrained(budget)
            run = self.run
        budget -= int(tokens.sum())
        if preempted == 0 and self.waiting:
            admitted: list[int] = []
            admitted_tokens: list[int] = []
            while self.waiting and len(run) + len(admitted) < self.limits.max_num_seqs and budget > 0:
                request = self.waiting[0]
                chunk = min(request.prompt_tokens + request.output, budget)
                blocks = self._blocks_for(chunk)
                if blocks > self.free_blocks:
                    break
                self.waiting.popleft()
                slot = self._occupy(request, now)
                self.s_blocks[slot] = blocks
                self.free_blocks -= blocks
                admitted.append(slot)
                admitted_tokens.append(chunk)
                budget -= chunk
            if admitted:
                self.run = run = np.concatenate([run, np.asarray(admitted, dtype=I64)])
                tokens = np.concatenate([tokens, np.asarray(admitted_tokens, dtype=I64)])
        return run, tokens, preempted

    def _schedule_constrained(self, budget: int) -> tuple[np.ndarray, int]:
        """The slow path, request by request in priority order: token budget exhausted or KV cache full."""
        order = [int(s) for s in self.run]
        tokens: dict[int, int] = {}
        preempted = 0
        i = 0
        while i < len(order):
            slot = order[i]
            computed, goal = int(self.s_computed[slot]), int(self.s_goal[slot])
            want = min(goal - computed, budget) if computed < goal else 1 + int(self.s_pending[slot])
            if want <= 0 or want > budget:
                tokens[slot] = 0
                i += 1
                continue
            while True:
                extra = self._blocks_for(computed + want) - int(self.s_blocks[slot])
                if extra <= self.free_blocks:
                    self.free_blocks -= max(extra, 0)
                    self.s_blocks[slot] += max(extra, 0)
                    tokens[slot] = want
                    budget -= want
                    i += 1
                    break
                victim = order.pop()  # lowest priority: the most recently admitted
                self._preempt(victim)
                preempted += 1
                if victim == slot:
                    break
        self.run = np.asarray(order, dtype=I64)
        return np.asarray([tokens[s] for s in order], dtype=I64), preempted

    def _preempt(self, slot: int) -> None:
        request = self._vacate(slot)
        request.computed = 0
        request.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _single_step(self, now: float) -> StepOutcome:
        run, tokens, preempted = self._schedule(now)
        scheduled = tokens > 0
        if not scheduled.all():
            run, tokens = run[scheduled], tokens[scheduled]
        batch = len(run)
        if batch == 0:
            return StepOutcome(now, np.zeros(0), np.zeros(0, dtype=I64), np.zeros((0, 0), dtype=I64), [])
        k = self._k_for(batch)
        computed = self.s_computed[run]
        decoding = computed >= self.s_goal[run]
        cat = self.s_cat[run]
        drafted = np.where(decoding, self.s_pending[run], 0)
        batched = int(tokens.sum())
        kv = int(computed.sum()) + batched
        duration = float(
            step_seconds(
                self.profile, kv_tokens=np.array([kv]), batched_tokens=np.array([batched]),
                k=k, batch_size=batch, speculative=self.speculative,
            )[0]
        )  # fmt: skip
        end = now + duration
        accepted = np.minimum(self._sample_prefix(cat, (1, batch))[0], drafted)
        remaining = self.s_target[run] - self.s_output[run]
        new_computed = np.where(decoding, computed + 1 + accepted, computed + tokens)
        # Decoders emit accepted + 1; a prefill emits its first token when its last chunk completes.
        emitted = np.where(decoding, np.minimum(1 + accepted, remaining), new_computed >= self.s_goal[run])
        self.s_computed[run] = new_computed
        self.s_output[run] += emitted
        decoding_next = new_computed >= self.s_goal[run]
        self.s_pending[run] = np.where(decoding_next, self._propose(cat, k, (batch,)), 0)
        step = self.steps.count
        self.steps.append(
            start=np.array([now]), end=np.array([end]), batch_size=np.array([batch]),
            num_prefill=np.array([batch - int(decoding.sum())]), k=np.array([k]),
            batched_tokens=np.array([batched]), kv_tokens=np.array([kv]),
            drafted=np.array([int(drafted.sum())]), accepted=np.array([int(accepted.sum())]),
            waiting=np.array([len(self.waiting)]), running=np.array([len(self.run)]),
            preempted=np.array([preempted]),
        )  # fmt: skip
        uids = self.s_uid[run]
        self.log.append(uid=uids, step=np.full(batch, step, dtype=I64), drafted=drafted, accepted=accepted,
                        emitted=emitted.astype(I64))  # fmt: skip
        first = np.flatnonzero(~decoding & decoding_next)
        for slot in run[first]:
            request = self.s_request[slot]
            if request is not None and request.first_token is None:
                request.first_token = end
        finished = self._retire(run, end)
        return StepOutcome(end, np.array([end]), uids, emitted[None, :].astype(I64), finished)

    def _decode_window(self, now: float, next_arrival: float, n: int) -> StepOutcome:
        run = self.run
        batch = len(run)
        k = self._k_for(batch)
        cat = self.s_cat[run]
        remaining = self.s_target[run] - self.s_output[run]
        drafted = np.empty((n, batch), dtype=I64)
        drafted[0] = self.s_pending[run]
        drafted[1:] = self._propose(cat, k, (n - 1, batch))
        accepted = np.minimum(self._sample_prefix(cat, (n, batch)), drafted)
        gained = 1 + accepted
        cum = np.cumsum(gained, axis=0)
        # A request finishes in the first step where its cumulative output reaches what it has left.
        done = cum >= remaining
        finish_step = np.where(done.any(axis=0), done.argmax(axis=0), n)
        batched = batch + drafted.sum(axis=1)
        kv = int(self.s_computed[run].sum()) + np.concatenate([[0], cum.sum(axis=1)[:-1]]) + batched
        durations = step_seconds(
            self.profile, kv_tokens=kv, batched_tokens=batched, k=k, batch_size=batch, speculative=self.speculative
        )
        ends = now + np.cumsum(durations)
        last = min(int(finish_step.min()), n - 1)
        if next_arrival < ends[last]:
            last = min(last, int(np.searchsorted(ends, next_arrival, side="left")))
        m = last + 1
        ends = ends[:m]
        drafted, accepted, gained, cum = drafted[:m], accepted[:m], gained[:m], cum[:m]
        # Tokens past a request's target are not emitted (it stops mid-acceptance).
        emitted = np.minimum(cum, remaining) - np.minimum(cum - gained, remaining)
        first_step = self.steps.count
        self.steps.append(
            start=np.concatenate([[now], ends[:-1]]), end=ends, batch_size=np.full(m, batch),
            num_prefill=np.zeros(m, dtype=I64), k=np.full(m, k), batched_tokens=batched[:m], kv_tokens=kv[:m],
            drafted=drafted.sum(axis=1), accepted=accepted.sum(axis=1),
            waiting=np.full(m, len(self.waiting)), running=np.full(m, batch), preempted=np.zeros(m, dtype=I64),
        )  # fmt: skip
        uids = self.s_uid[run]
        self.log.append(
            uid=np.tile(uids, m), step=np.repeat(np.arange(first_step, first_step + m, dtype=I64), batch),
            drafted=drafted.ravel(), accepted=accepted.ravel(), emitted=emitted.ravel(),
        )  # fmt: skip
        self.s_computed[run] += gained.sum(axis=0)
        self.s_output[run] += emitted.sum(axis=0)
        self.s_pending[run] = self._propose(cat, k, (batch,))
        finished = self._retire(run, float(ends[-1]))
        return StepOutcome(float(ends[-1]), ends, uids, emitted, finished)

    def _retire(self, run: np.ndarray, end: float) -> list[SimRequest]:
        done = self.s_output[run] >= self.s_target[run]
        if not done.any():
            return []
        finished = []
        for slot in run[done]:
            request = self._vacate(int(slot))
            request.finished_at = end
            request.finish_reason = "length" if request.output >= request.max_tokens else "stop"
            finished.append(request)
        self.run = self.run[~np.isin(self.run, run[done])]
        return finished

    # --- records --------------------------------------------------------------------------------------------
    def record_for(self, request: SimRequest) -> RequestRecord:
        return self.records_for([request])[0]

    def records_for(self, requests: list[SimRequest]) -> list[RequestRecord]:
        """Records of finished requests, built from the request-step log in one pass."""
        if not requests:
            return []
        for request in requests:
            if not request.finished:
                raise ValueError(f"request {request.request_id} has not finished")
        first_chunk = min(r.first_chunk for r in requests)
        uid = self.log.column("uid", first_chunk)
        wanted = np.fromiter((r.uid for r in requests), dtype=I64, count=len(requests))
        mask = np.isin(uid, wanted)
        uid = uid[mask]
        order = np.argsort(uid, kind="stable")  # rows are appended in time order; stable keeps it per request
        uid = uid[order]
        cols = {c: self.log.column(c, first_chunk)[mask][order] for c in ("step", "drafted", "accepted", "emitted")}
        ends = self.steps.column("end")
        batch_sizes = self.steps.column("batch_size")
        ks = self.steps.column("k")
        bounds = np.searchsorted(uid, wanted, side="left"), np.searchsorted(uid, wanted, side="right")
        records = []
        for i, request in enumerate(requests):
            lo, hi = int(bounds[0][i]), int(bounds[1][i])
            steps = cols["step"][lo:hi]
            assert request.first_scheduled is not None and request.first_token is not None
            assert request.finished_at is not None and request.finish_reason is not None
            records.append(
                RequestRecord(
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
                    token_times=np.repeat(ends[steps], cols["emitted"][lo:hi]),
                    step_batch_size=batch_sizes[steps].astype(I64),
                    step_k=ks[steps].astype(I64),
                    step_drafted=cols["drafted"][lo:hi],
                    step_accepted=cols["accepted"][lo:hi],
                    num_spec_tokens=self.max_k,
                )
            )
        return records
