"""The simulated engine's core: vLLM-style continuous batching with speculative decoding, clock-agnostic.

`EngineCore.run_steps(now, ...)` schedules and executes engine steps starting at `now` and returns when they
end; the virtual-time and real-time drivers decide what "now" is. Tokens carry the end time of their step.

Scheduling follows vLLM's V1 scheduler: running requests first, in admission order (decode: 1 + pending drafts;
unfinished prefill: a chunk of what is left of the token budget), then waiting requests FCFS while
max_num_seqs, the token budget and KV blocks allow (not in a step that preempted). When KV blocks run out the
most recently admitted running request is preempted (recompute: it re-enters the front of the queue and later
prefills prompt + output again). The k for a step comes from the number of requests scheduled in it (vLLM's
dynamic_sd_lookup[len(num_scheduled_tokens)]); the drafter proposes that many tokens at the end of the step and
the next step verifies them. Each request accepts a prefix of its drafts with per-position probabilities of its
workload category and emits accepted + 1 tokens.

Per-token work runs in a compiled kernel (kernel.py) over slot arrays; this module does the per-request
events: admission, preemption, finishing, and the logs that records are built from.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from serve_apps.policies import ResolvedSpeculation
from serve_apps.resolved import GateRule, SglangRule
from serve_apps.sim import kernel
from serve_apps.sim.profile import Profile
from serve_apps.sim.request import RequestRecord, SimRequest
from serve_apps.sim.rules import RULE_GATE, RULE_SGLANG, RULE_TABLE, sglang_adaptive, trtllm_gate

I64 = np.int64
_LOG_CAPACITY = 1 << 18
_STEP_CAPACITY = 1 << 14
_NO_INTS = np.zeros((1, 1), dtype=I64)
_NO_FLOATS = np.zeros((1, 1))
_STEP_INT_COLUMNS = (
    "batch_size", "num_prefill", "k", "batched_tokens", "kv_tokens", "drafted", "accepted", "waiting", "running",
    "preempted",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one call to run_steps did: when its last step ended, who got tokens, who finished.

    log_rows is a view of the engine's buffer: read it before the next run_steps call.
    """

    end: float
    steps: int
    log_rows: np.ndarray  # request-step rows of these steps: uid, step, drafted, accepted, emitted
    finished: list[SimRequest]

    def tokens_by_uid(self) -> dict[int, int]:
        if not len(self.log_rows):
            return {}
        uids, inverse = np.unique(self.log_rows[:, 0], return_inverse=True)
        counts = np.bincount(inverse, weights=self.log_rows[:, 4]).astype(I64)
        return {int(u): int(c) for u, c in zip(uids, counts, strict=True) if c}


class StepTable:
    """Every executed engine step: the per-engine timeline (batch size against executed k over time)."""

    COLUMNS = ("start", "end", *_STEP_INT_COLUMNS)

    def __init__(self) -> None:
        self._floats: list[np.ndarray] = []
        self._ints: list[np.ndarray] = []
        self.count = 0

    def append(self, floats: np.ndarray, ints: np.ndarray) -> None:
        self._floats.append(floats)
        self._ints.append(ints)
        self.count += len(floats)

    def _merged(self) -> tuple[np.ndarray, np.ndarray]:
        if len(self._floats) != 1:
            self._floats = [np.concatenate(self._floats) if self._floats else np.zeros((0, 2))]
            self._ints = [
                np.concatenate(self._ints) if self._ints else np.zeros((0, len(_STEP_INT_COLUMNS)), dtype=I64)
            ]
        return self._floats[0], self._ints[0]

    def column(self, name: str) -> np.ndarray:
        floats, ints = self._merged()
        if name in ("start", "end"):
            return floats[:, 0 if name == "start" else 1]
        return ints[:, _STEP_INT_COLUMNS.index(name)]

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
        # A stateful rule (SGLang's slots, TensorRT-LLM's gate): its constants and its state, kept between calls.
        self._rule, self._rule_ints, self._rule_floats, self.rule_state = RULE_TABLE, _NO_INTS, _NO_FLOATS, _NO_FLOATS
        if isinstance(speculation.rule, SglangRule):
            self.k_table, self._rule_ints, self._rule_floats, self.rule_state = sglang_adaptive.compile_rule(
                speculation.rule, self.limits.max_num_seqs
            )
            self._rule = RULE_SGLANG
        elif isinstance(speculation.rule, GateRule):
            self._rule_floats, self.rule_state = trtllm_gate.compile_gate(speculation.rule)
            self._rule = RULE_GATE
        self._fresh_rule_state = self.rule_state.copy()
        self.max_window = max_window
        self.total_blocks = self.limits.kv_cache_tokens // self.limits.block_size
        self.waiting: deque[SimRequest] = deque()
        self.num_preemptions = 0
        self._categories: dict[str, int] = {}
        self._cdf = np.zeros((0, self.max_k + 1))
        self._avail = np.zeros(0)
        self._next_uid = 0
        self._costs, self._draft_kind = _cost_vector(profile, self.speculative, speculation.k0_idle_drafter)
        self._rng = np.array([(seed * 0x2545F4914F6CDD1D + 1) % 2**64], dtype=np.uint64)
        # Running requests, compact and in scheduling (admission) order: entries [0, n_run).
        # Rows (kernel.COMPUTED ... kernel.UID): tokens in the KV cache, tokens emitted, tokens to emit, tokens to
        # prefill before decoding, drafts to verify next step, KV blocks held, workload category, request uid.
        n = self.limits.max_num_seqs
        self.n_run = 0
        self.state = np.zeros((kernel.STATE_ROWS, n), dtype=I64)
        self.r_first_token = np.full(n, np.nan)
        self._need_room = False
        self._by_uid: dict[int, SimRequest] = {}
        # free blocks, steps, log rows used, the last step's k (-1: no step yet)
        self._counters = np.array([self.total_blocks, 0, 0, -1], dtype=I64)
        self._log_buffer = np.zeros((max(_LOG_CAPACITY, 2 * n * max_window), 5), dtype=I64)
        self._log_chunks: list[np.ndarray] = []
        self._step_floats = np.zeros((_STEP_CAPACITY, 2))
        self._step_ints = np.zeros((_STEP_CAPACITY, len(_STEP_INT_COLUMNS)), dtype=I64)
        self._steps_buffered = 0
        self._table = StepTable()
        self._finished = np.zeros((2 * n + 1, 2), dtype=I64)
        self._finished_at = np.zeros((2 * n + 1, 2))  # finish time, first-token time
        self._staged = np.zeros((kernel.STATE_ROWS, n), dtype=I64)
        self._staged_first_token = np.full(n, np.nan)
        self._admit_time = np.zeros(n)

    def begin_unit(self) -> None:
        """A unit starts from the rule's fresh state (SGLang's EMA and warm-up count, TensorRT-LLM's gate open), as
        a virtual-time unit's new engine does: a real-time replica serves every unit, and its warm-up requests,
        one after another, and would otherwise carry the last unit's state into the next. Called between units,
        when no request is in flight."""
        self.rule_state[...] = self._fresh_rule_state

    # --- requests -------------------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return int(self._counters[0])

    @property
    def running(self) -> list[SimRequest]:
        return [self._by_uid[int(u)] for u in self.state[kernel.UID, : self.n_run]]

    @property
    def steps(self) -> StepTable:
        self._flush_steps()
        return self._table

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
        return bool(self.waiting) or self.n_run > 0

    def abort(self, request: SimRequest) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
            return
        positions = np.flatnonzero(self.state[kernel.UID, : self.n_run] == request.uid)
        if len(positions):
            self._remove_running(int(positions[0]))

    def _category_index(self, category: str) -> int:
        index = self._categories.get(category)
        if index is not None:
            return index
        acceptance = self.profile.acceptance_for(category)
        # P(accepted prefix >= j) = p_1 * ... * p_j; cdf[j] = P(prefix <= j).
        survive = np.cumprod([acceptance.prob(i) for i in range(self.max_k)]) if self.max_k else np.zeros(0)
        pmf_ge = np.concatenate([[1.0], survive])
        pmf = pmf_ge - np.concatenate([pmf_ge[1:], [0.0]])
        self._cdf = np.ascontiguousarray(np.vstack([self._cdf, np.cumsum(pmf)[None, :]]))
        self._avail = np.append(self._avail, acceptance.draft_availability)
        index = self._categories[category] = len(self._categories)
        return index

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.limits.block_size)

    def _remove_running(self, position: int) -> SimRequest:
        """Take the request at `position` out of the running arrays, freeing its KV blocks."""
        state = self.state
        request = self._by_uid.pop(int(state[kernel.UID, position]))
        request.output = int(state[kernel.OUTPUT, position])
        if request.first_token is None and not np.isnan(self.r_first_token[position]):
            request.first_token = float(self.r_first_token[position])
        self._counters[0] += state[kernel.BLOCKS, position]
        n = self.n_run
        state[:, position : n - 1] = state[:, position + 1 : n]
        self.r_first_token[position : n - 1] = self.r_first_token[position + 1 : n]
        self.n_run = n - 1
        return request

    # --- stepping -------------------------------------------------------------------------------------------
    def run_steps(
        self,
        now: float,
        *,
        next_arrival: float = math.inf,
        max_steps: int | None = None,
        stop_on_finish: bool = False,
    ) -> StepOutcome:
        """Run engine steps from `now` until a known arrival is due, a request event needs Python, or max_steps.

        A finish ends the call when requests are waiting (a slot is free) or when stop_on_finish is set (a
        closed-loop driver replaces finished requests at once).
        """
        limit = min(self.max_window if max_steps is None else max_steps, _STEP_CAPACITY)
        if self._steps_buffered + limit > _STEP_CAPACITY:
            self._flush_steps()
        if self._counters[2] + limit * self.limits.max_num_seqs > len(self._log_buffer):
            self._flush_log()
        preempted = self._make_room() if self._need_room else 0
        # Stage the head of the queue (no admission in a step that preempted, as in vLLM); a few more than the
        # free seats so requests finishing inside the call can be replaced without coming back here.
        n_staged = 0 if preempted else min(len(self.waiting), self.limits.max_num_seqs - self.n_run + 8,
                                           self.limits.max_num_seqs)  # fmt: skip
        for q in range(n_staged):
            request = self.waiting[q]
            self._staged[:, q] = (
                0, request.output, request.target_tokens, request.prompt_tokens + request.output, 0, 0,
                self._categories[request.category], request.uid, 0,
            )  # fmt: skip
            self._staged_first_token[q] = np.nan if request.first_token is None else request.first_token
        log_start = int(self._counters[2])
        reason, steps, n_done, end, n_after, n_admitted = kernel.run_steps(
            self.n_run, self.state, self.r_first_token,
            self._staged, self._staged_first_token, n_staged, self._admit_time,
            self._counters, self._rng, self._cdf, self._avail, self.k_table, self._rule, self._rule_ints,
            self._rule_floats, self.rule_state, self.speculation.floor0_fault, self._costs, self._draft_kind,
            self.limits.max_num_batched_tokens, self.limits.block_size,
            now, next_arrival, limit, stop_on_finish, len(self.waiting),
            self._step_floats[self._steps_buffered :], self._step_ints[self._steps_buffered :],
            self._log_buffer, self._finished, self._finished_at,
        )  # fmt: skip
        for q in range(n_admitted):
            request = self.waiting.popleft()
            self._by_uid[request.uid] = request
            if request.first_scheduled is None:
                request.first_scheduled = float(self._admit_time[q])
                request.first_chunk = len(self._log_chunks)
        self._need_room = reason == kernel.STOP_NEED_BLOCKS
        if steps:
            self._step_ints[self._steps_buffered, -1] = preempted
            self._steps_buffered += steps
        finished: list[SimRequest] = []
        for (uid, output), (when, first_token) in zip(self._finished[:n_done], self._finished_at[:n_done], strict=True):
            request = self._by_uid.pop(int(uid))
            request.output = int(output)
            request.first_token = float(first_token)
            request.finished_at = float(when)
            request.finish_reason = "length" if request.output >= request.max_tokens else "stop"
            finished.append(request)
        self.n_run = n_after
        rows = self._log_buffer[log_start : self._counters[2]]
        if steps == 0 and (preempted or self._need_room):
            return self.run_steps(now, next_arrival=next_arrival, max_steps=max_steps, stop_on_finish=stop_on_finish)
        return StepOutcome(end=end, steps=steps, log_rows=rows, finished=finished)

    def _blocks_needed(self) -> int:
        """KV blocks the running requests would add this step (whole remaining prefill, or 1 + drafts)."""
        n = self.n_run
        computed, goal = self.state[kernel.COMPUTED, :n], self.state[kernel.GOAL, :n]
        want = np.where(computed < goal, goal - computed, 1 + self.state[kernel.PENDING, :n])
        extra = np.maximum(-(-(computed + want) // self.limits.block_size) - self.state[kernel.BLOCKS, :n], 0)
        return int(extra.sum())

    def _make_room(self) -> int:
        """Preempt from the back of the running list until this step's KV growth fits (vLLM's recompute mode)."""
        preempted = 0
        while self.n_run:
            if self._blocks_needed() <= self._counters[0]:
                break
            request = self._remove_running(self.n_run - 1)
            request.preemptions += 1
            self.num_preemptions += 1
            self.waiting.appendleft(request)
            preempted += 1
        return preempted

    def _flush_log(self) -> None:
        used = int(self._counters[2])
        if used:
            self._log_chunks.append(self._log_buffer[:used].copy())
            self._counters[2] = 0

    def _flush_steps(self) -> None:
        if self._steps_buffered:
            n = self._steps_buffered
            self._table.append(self._step_floats[:n].copy(), self._step_ints[:n].copy())
            self._steps_buffered = 0

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
        self._flush_log()
        first_chunk = min(r.first_chunk for r in requests)
        chunks = self._log_chunks[first_chunk:]
        log = np.concatenate(chunks) if chunks else np.zeros((0, 5), dtype=I64)
        wanted = np.fromiter((r.uid for r in requests), dtype=I64, count=len(requests))
        log = log[np.isin(log[:, 0], wanted)]
        log = log[np.argsort(log[:, 0], kind="stable")]  # rows are in time order; stable keeps it per request
        table = self.steps
        steps = log[:, 1]
        emitted = log[:, 4]
        # Whole-log columns first; each record then takes contiguous slices of them.
        token_times = np.repeat(table.column("end")[steps], emitted)
        step_batch = table.column("batch_size")[steps]
        step_k = table.column("k")[steps]
        drafted = np.ascontiguousarray(log[:, 2])
        accepted = np.ascontiguousarray(log[:, 3])
        row_bounds = np.searchsorted(log[:, 0], wanted, side="left"), np.searchsorted(log[:, 0], wanted, side="right")
        token_bounds = np.concatenate([[0], np.cumsum(emitted)])
        records = []
        for i, request in enumerate(requests):
            lo, hi = int(row_bounds[0][i]), int(row_bounds[1][i])
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
                    token_times=token_times[token_bounds[lo] : token_bounds[hi]],
                    step_batch_size=step_batch[lo:hi],
                    step_k=step_k[lo:hi],
                    step_drafted=drafted[lo:hi],
                    step_accepted=accepted[lo:hi],
                    num_spec_tokens=self.max_k,
                )
            )
        return records


def _cost_vector(profile: Profile, speculative: bool, k0_idle_drafter: bool) -> tuple[np.ndarray, int]:
    """The kernel's cost vector. Without `k0_idle_drafter` (TensorRT-LLM) a step with k = 0 runs no drafter."""
    v, d = profile.verify, profile.draft
    costs = np.zeros(kernel.N_COSTS)
    costs[kernel.C_V_KV], costs[kernel.C_V_BATCHED], costs[kernel.C_V_FIXED] = (
        v.per_kv_token,
        v.per_batched_token,
        v.fixed,
    )
    costs[kernel.C_D_KV], costs[kernel.C_D_TOKEN], costs[kernel.C_D_FIXED] = d.per_kv_token, d.per_draft_token, d.fixed
    costs[kernel.C_D_FRACTION] = d.fraction
    if k0_idle_drafter:
        costs[kernel.C_IDLE_FIXED], costs[kernel.C_IDLE_REQ] = d.idle_fixed, d.idle_per_request
    costs[kernel.C_OVERHEAD] = profile.step_overhead
    costs[kernel.C_K_SWITCH] = profile.k_switch_cost_s
    if not speculative:
        return costs, kernel.DRAFT_NONE
    return costs, kernel.DRAFT_MODEL if d.kind == "model" else kernel.DRAFT_FRACTION
