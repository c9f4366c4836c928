"""The engine's inner loop, compiled with numba: schedule and execute decode/prefill steps on slot arrays.

Python (engine.py) owns everything that happens per request event: admission from the queue, preemption,
finishing. This kernel owns everything that happens per token: each step's batch, its k, its cost, every
request's accepted prefix, tokens and drafts, and the step and request-step logs. One kernel call runs steps
until something needs Python: a known arrival is due, a finish frees a slot while requests wait, the KV cache
is short (preemption), or max_steps ran.

Random numbers come from a per-engine splitmix64 stream, so results depend only on the seed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from serve_apps.sim.rules import RULE_GATE, RULE_SGLANG, RULE_TABLE
from serve_apps.sim.rules import sglang_adaptive as sglang
from serve_apps.sim.rules import trtllm_gate as gate

# Draft cost kinds (profile.draft.kind); NONE for engines without speculation.
DRAFT_NONE, DRAFT_MODEL, DRAFT_FRACTION = 0, 1, 2
# Cost vector layout.
C_V_KV, C_V_BATCHED, C_V_FIXED, C_D_KV, C_D_TOKEN, C_D_FIXED, C_D_FRACTION, C_IDLE_FIXED, C_IDLE_REQ, C_OVERHEAD = (
    range(10)
)
C_K_SWITCH = 10  # extra cost of a step whose k differs from the previous step's
N_COSTS = 11
# Rows of the running-request state array (one column per running request, in scheduling order). STALE: the
# request decoded through a k = 0 step while the floor-0 fault is planted (it accepts no draft afterwards).
COMPUTED, OUTPUT, TARGET, GOAL, PENDING, BLOCKS, CAT, UID, STALE = range(9)
STATE_ROWS = 9
# Why a kernel call returned.
STOP_MAX_STEPS, STOP_ARRIVAL, STOP_IDLE, STOP_SLOT_FREED, STOP_NEED_BLOCKS, STOP_NOTHING_SCHEDULABLE = range(6)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53


@njit(cache=True)
def uniform(state: np.ndarray) -> float:
    state[0] += _GOLDEN
    z = state[0]
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    z = z ^ (z >> _S31)
    return float(z >> _S11) * _TO_UNIT


@njit(cache=True)
def step_cost(costs: np.ndarray, draft_kind: int, kv: float, batched: float, k: int, batch: int) -> float:
    """verify(N_kv, N_batched) + draft(N_kv, k) + overhead; a speculative step with k = 0 pays the idle drafter."""
    verify = costs[C_V_KV] * kv + costs[C_V_BATCHED] * batched + costs[C_V_FIXED]
    draft = 0.0
    if draft_kind != DRAFT_NONE:
        if k == 0:
            draft = costs[C_IDLE_FIXED] + costs[C_IDLE_REQ] * batch
        elif draft_kind == DRAFT_MODEL:
            draft = costs[C_D_KV] * kv + costs[C_D_TOKEN] * k + costs[C_D_FIXED]
        else:
            draft = costs[C_D_FRACTION] * verify
    return verify + draft + costs[C_OVERHEAD]


@njit(cache=True)
def compact(state: np.ndarray, first_token: np.ndarray, alive: np.ndarray, tokens: np.ndarray, n: int) -> int:
    """Drop finished entries from [0, n), keeping the order of the rest; returns how many remain."""
    j = 0
    for i in range(n):
        if alive[i]:
            if j != i:
                for row in range(STATE_ROWS):
                    state[row, j] = state[row, i]
                first_token[j] = first_token[i]
                tokens[j] = tokens[i]
                alive[j] = True
            j += 1
    for i in range(j, n):
        alive[i] = False
        tokens[i] = 0
    return j


@njit(cache=True)
def run_steps(
    n_run: int,
    state: np.ndarray,  # int64 (STATE_ROWS, max_num_seqs)
    first_token: np.ndarray,  # float64 (max_num_seqs,), NaN until the first token
    staged: np.ndarray,  # int64 (STATE_ROWS, S): the head of the waiting queue, admissible in FCFS order
    staged_first_token: np.ndarray,  # float64 (S,)
    n_staged: int,
    admit_time: np.ndarray,  # float64 (S,): out, when each admitted staged request was first scheduled
    counters: np.ndarray,  # [free_blocks, steps so far, log rows used, previous step's k (-1: none yet)]
    rng: np.ndarray,
    cdf: np.ndarray,
    avail: np.ndarray,
    k_table: np.ndarray,  # batch -> k (RULE_TABLE, RULE_GATE's base) or batch -> SGLang slot (RULE_SGLANG)
    rule: int,  # serve_apps/sim/rules: RULE_TABLE (vLLM's lookup, no state), RULE_SGLANG, RULE_GATE
    rule_ints: np.ndarray,  # int64 2D, the rule's constants (rules/<design>.py says the layout)
    rule_floats: np.ndarray,  # float64 2D, the rule's constants
    rule_state: np.ndarray,  # float64 2D, the rule's state, carried from call to call
    floor0_fault: bool,
    costs: np.ndarray,
    draft_kind: int,
    budget_per_step: int,
    block_size: int,
    now: float,
    next_arrival: float,
    max_steps: int,
    stop_on_finish: bool,
    waiting: int,  # requests waiting, staged ones included
    steps_out: np.ndarray,  # float64 (max_steps, 2): start, end
    steps_int: np.ndarray,  # int64 (max_steps, 9): batch, prefill, k, batched, kv, drafted, accepted, waiting, running
    log: np.ndarray,  # int64 (capacity, 5): uid, step, drafted, accepted, emitted
    finished: np.ndarray,  # int64 (n, 2): uid, output
    finished_at: np.ndarray,  # float64 (n, 2): finish time, first-token time
) -> tuple[int, int, int, float, int, int]:
    """Returns (reason, steps run, requests finished, engine time, n_run after compaction, staged admitted)."""
    computed, output, target, goal = state[COMPUTED], state[OUTPUT], state[TARGET], state[GOAL]
    pending, blocks, cat, uid, stale = state[PENDING], state[BLOCKS], state[CAT], state[UID], state[STALE]
    capacity = state.shape[1]
    n_steps = 0
    n_done = 0
    n_cur = n_run
    admitted = 0
    t = now
    tokens = np.zeros(capacity, dtype=np.int64)
    alive = np.zeros(capacity, dtype=np.bool_)
    alive[:n_run] = True
    live = n_run
    reason = STOP_MAX_STEPS
    while n_steps < max_steps:
        # --- schedule: running requests in order; budget first, then KV blocks for what they write ---
        budget = budget_per_step
        batch = 0
        n_prefill = 0
        extra_total = 0
        for i in range(n_cur):
            tokens[i] = 0
            if not alive[i]:
                continue
            if computed[i] < goal[i]:
                want = min(goal[i] - computed[i], budget)
            else:
                want = 1 + pending[i]
                if want > budget:
                    continue
            if want <= 0:
                continue
            need = (computed[i] + want + block_size - 1) // block_size - blocks[i]
            if need > 0:
                extra_total += need
            tokens[i] = want
            budget -= want
            batch += 1
        if extra_total > counters[0]:
            reason = STOP_NEED_BLOCKS
            break
        # --- admit from the queue head while seats, budget and KV blocks allow (vLLM: after running ones) ---
        while admitted < n_staged and live < capacity and budget > 0:
            chunk = min(staged[GOAL, admitted], budget)
            need = (chunk + block_size - 1) // block_size
            if extra_total + need > counters[0]:
                break
            if n_cur == capacity:  # compact finished entries away to make room at the end
                n_cur = compact(state, first_token, alive, tokens, n_cur)
            for row in range(STATE_ROWS):
                state[row, n_cur] = staged[row, admitted]
            first_token[n_cur] = staged_first_token[admitted]
            alive[n_cur] = True
            tokens[n_cur] = chunk
            admit_time[admitted] = t
            extra_total += need
            budget -= chunk
            batch += 1
            n_cur += 1
            live += 1
            admitted += 1
        if batch == 0:
            reason = STOP_NOTHING_SCHEDULABLE if n_steps == 0 else STOP_IDLE
            break
        if counters[2] + batch > log.shape[0]:
            reason = STOP_MAX_STEPS
            break
        # The k proposed at the end of this step, decided before the step's own verification is seen (vLLM's
        # lookup; SGLang's and TensorRT-LLM's overlap schedulers launch a batch before processing the last).
        if draft_kind == 0:
            k = 0
        elif rule == RULE_TABLE:
            k = k_table[min(batch, k_table.shape[0] - 1)]
        elif rule == RULE_SGLANG:
            k = sglang.decide(k_table, rule_ints, rule_state, batch)
        else:
            k = gate.decide(k_table, rule_state, batch)
        batched = 0
        kv = 0
        drafted_sum = 0
        for i in range(n_cur):
            if tokens[i] == 0:
                continue
            need = (computed[i] + tokens[i] + block_size - 1) // block_size - blocks[i]
            if need > 0:
                blocks[i] += need
                counters[0] -= need
            batched += tokens[i]
            kv += computed[i] + tokens[i]
            if computed[i] < goal[i]:
                n_prefill += 1
            else:
                drafted_sum += pending[i]
        end = t + step_cost(costs, draft_kind, float(kv), float(batched), k, batch)
        if counters[3] >= 0 and k != counters[3]:
            end += costs[C_K_SWITCH]
        counters[3] = k
        # --- execute: accept a prefix of the drafts, emit accepted + 1, propose k drafts for the next step ---
        step = counters[1]
        accepted_sum = 0
        freed = False
        row = counters[2]
        for i in range(n_cur):
            if tokens[i] == 0:
                continue
            emitted = 0
            drafted = 0
            accepted = 0
            if computed[i] < goal[i]:
                computed[i] += tokens[i]
                if computed[i] >= goal[i]:
                    emitted = 1
                    if np.isnan(first_token[i]):
                        first_token[i] = end
            else:
                drafted = pending[i]
                if drafted > 0:
                    u = uniform(rng)
                    c = cdf[cat[i]]
                    while accepted < drafted and u >= c[accepted]:
                        accepted += 1
                    if floor0_fault and stale[i]:
                        accepted = 0
                if floor0_fault and k == 0:
                    stale[i] = 1
                computed[i] += 1 + accepted
                emitted = min(1 + accepted, target[i] - output[i])
            output[i] += emitted
            accepted_sum += accepted
            log[row, 0] = uid[i]
            log[row, 1] = step
            log[row, 2] = drafted
            log[row, 3] = accepted
            log[row, 4] = emitted
            row += 1
            if output[i] >= target[i]:
                alive[i] = False
                live -= 1
                pending[i] = 0
                finished[n_done, 0] = uid[i]
                finished[n_done, 1] = output[i]
                finished_at[n_done, 0] = end
                finished_at[n_done, 1] = first_token[i]
                n_done += 1
                counters[0] += blocks[i]
                blocks[i] = 0
                freed = True
            elif computed[i] >= goal[i] and k > 0 and uniform(rng) < avail[cat[i]]:
                pending[i] = k
            else:
                pending[i] = 0
        counters[2] = row
        if rule == RULE_SGLANG:
            sglang.observe(rule_ints, rule_floats, rule_state, batch - n_prefill, accepted_sum)
        elif rule == RULE_GATE:
            gate.observe(rule_floats, rule_state, drafted_sum, accepted_sum)
        steps_out[n_steps, 0] = t
        steps_out[n_steps, 1] = end
        steps_int[n_steps, 0] = batch
        steps_int[n_steps, 1] = n_prefill
        steps_int[n_steps, 2] = k
        steps_int[n_steps, 3] = batched
        steps_int[n_steps, 4] = kv
        steps_int[n_steps, 5] = drafted_sum
        steps_int[n_steps, 6] = accepted_sum
        steps_int[n_steps, 7] = waiting - admitted
        steps_int[n_steps, 8] = live
        counters[1] += 1
        n_steps += 1
        t = end
        if next_arrival <= t:
            reason = STOP_ARRIVAL
            break
        if freed and (stop_on_finish or (admitted == n_staged and waiting > n_staged)):
            reason = STOP_SLOT_FREED
            break
        if live == 0 and admitted == n_staged:
            reason = STOP_IDLE
            break
    return reason, n_steps, n_done, t, compact(state, first_token, alive, tokens, n_cur), admitted
