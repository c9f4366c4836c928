"""SGLang's adaptive speculative steps (`--speculative-adaptive`), as SGLang 0.5.23 runs them.

Read from the wheel (`pip download --no-deps sglang==0.5.23`), paths under sglang/srt/:
- speculative/adaptive_spec_params.py 153-272 (AdaptiveStepSlot): each batch-size slot keeps an EMA of the
  accepted drafts per request (`num_correct_drafts`: accepted length minus the bonus token) and its current
  steps. update(): the EMA moves only while the slot's steps > 0 (196-202); every call counts a batch (204);
  nothing changes during the first `warmup_batches` (205-206), then the steps are recomputed every
  `update_interval` batches (208-211). _recompute_params(): from 0 it probes the next candidate (220-227, EMA
  reset to target - 1 if negative); else it steps down while EMA <= (0.5 if the lower candidate is 0 else lower -
  0.5) + down_hysteresis (230-239), and only if it did not step down, up while EMA > current - 0.5 +
  up_hysteresis (241-249); ceiling_coeff > 0 caps a target that is not a step up (254-259).
- same file 342-358 (_route): the batch is padded up to the next decode CUDA-graph batch size (bisect_left;
  above the largest, unpadded), then the slot with the largest key <= it (bisect_right - 1, at least the first).
- speculative/adaptive_runtime_state.py 122-135: activate_step_by_batch(batch) picks the slot's steps before
  each decode forward; on_verify_complete feeds the verified batch's per-request accepted drafts to the slot of
  that batch size. managers/scheduler.py 2061-2128 (event_loop_overlap, the default): batch t+1 is launched
  before batch t's result is processed, so a decision never sees the batch verified just before it.
- arg_groups/cuda_graph_hook.py 500-532: decode capture sizes with speculation: 1..8, 10..32 step 2, 40..64
  step 4, 72..256 step 8, 272.. step 16, up to max_bs (appended if missing); arg_groups/memory_hook.py 141-145
  and 182-188: max_bs 256 on an 80 GB GPU with TP < 4, capped at max_running_requests.

Mapping to specdrill's step: a simulated step verifies the drafts proposed at the end of the step before and
proposes k for the next, so SGLang's iteration (draft `steps`, verify) spans the end of one simulated step and
the verification in the next. k = steps (SGLang's `speculative_num_draft_tokens` = steps + 1 counts the verified
root token); steps = 0 still runs a 1-token verify and the drafter's KV update (eagle_worker_v2.py 1469-1506),
which the simulated engine charges as its idle drafter.

Arrays (built by `compile_rule`): route[b] = slot of batch size b; ints[s] = [n candidates, candidates...];
floats[0] = [ema_alpha, update_interval, warmup_batches], floats[1 + s] = [up_h, down_h, ceiling_coeff];
state[0] = [slot whose drafts the next step verifies (-1: none), slot of the last decision, 0],
state[1 + s] = [EMA, batches counted, index of the current steps].
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

import numpy as np
from numba import njit

from serve_apps.resolved import SglangRule, SglangTier

# adaptive_spec_params.py 28-53 (DEFAULT_ADAPTIVE_CONFIG); hysteresis defaults 174-175 where an entry omits them.
DEFAULT_TIERS: tuple[SglangTier, ...] = (
    SglangTier(lower_bound=1, candidate_steps=(1, 3, 5, 7), up_hysteresis=0.0, down_hysteresis=-0.25),
    SglangTier(lower_bound=8, candidate_steps=(0, 1, 3), up_hysteresis=0.0, down_hysteresis=0.0),
    SglangTier(lower_bound=32, candidate_steps=(0, 1), up_hysteresis=0.0, down_hysteresis=0.0),
    SglangTier(lower_bound=64, candidate_steps=(0,), up_hysteresis=0.0, down_hysteresis=0.0),
)
DEFAULT_CUDA_GRAPH_MAX_BS = 256  # memory_hook.py 141-145: an 80 GB GPU (H100), tp_size < 4


def decode_cuda_graph_bs(max_bs: int) -> tuple[int, ...]:
    """generate_decode_cuda_graph_batch_sizes with speculation on and padding enabled (cuda_graph_hook.py 517-532)."""
    sizes = (
        list(range(1, 9))
        + list(range(10, 33, 2))
        + list(range(40, 65, 4))
        + list(range(72, 257, 8))
        + list(range(272, max_bs + 1, 16))
    )
    sizes = [b for b in sizes if b <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return tuple(sizes)


def initial_index(tier: SglangTier, initial_steps: int) -> int:
    """AdaptiveStepSlot.__init__ (178-181): the initial steps if a candidate, else the middle candidate."""
    candidates = sorted(set(tier.candidate_steps))
    return candidates.index(initial_steps) if initial_steps in candidates else len(candidates) // 2


def graph_sizes(rule: SglangRule, max_num_seqs: int) -> tuple[int, ...] | None:
    """The decode CUDA-graph sizes SGLang captures for this engine (None: graphs disabled, no padding)."""
    if not rule.cuda_graph:
        return None
    if rule.cuda_graph_max_bs is not None:
        return decode_cuda_graph_bs(rule.cuda_graph_max_bs)
    return decode_cuda_graph_bs(min(DEFAULT_CUDA_GRAPH_MAX_BS, max_num_seqs))  # memory_hook.py 182-188


def slot_for_batch(rule: SglangRule, batch_size: int, graphs: tuple[int, ...] | None) -> int:
    """_route (342-358): pad up to the next CUDA-graph size, then the largest key <= it (index into rule.tiers)."""
    padded = batch_size
    if graphs is not None:
        i = bisect_left(graphs, batch_size)
        padded = graphs[i] if i < len(graphs) else batch_size
    keys = [t.lower_bound for t in rule.tiers]
    return max(0, bisect_right(keys, padded) - 1)


def compile_rule(rule: SglangRule, max_num_seqs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(route, ints, floats, state) for the kernel; `rule.tiers` must be sorted by lower_bound."""
    graphs = graph_sizes(rule, max_num_seqs)
    route = np.array([0] + [slot_for_batch(rule, b, graphs) for b in range(1, max_num_seqs + 1)], dtype=np.int64)
    width = max(len(set(t.candidate_steps)) for t in rule.tiers)
    ints = np.zeros((len(rule.tiers), 1 + width), dtype=np.int64)
    floats = np.zeros((1 + len(rule.tiers), 3))
    floats[0] = (rule.ema_alpha, rule.update_interval, rule.warmup_batches)
    state = np.zeros((1 + len(rule.tiers), 3))
    state[0] = (-1, -1, 0)
    for s, tier in enumerate(rule.tiers):
        candidates = sorted(set(tier.candidate_steps))
        ints[s, 0] = len(candidates)
        ints[s, 1 : 1 + len(candidates)] = candidates
        floats[1 + s] = (tier.up_hysteresis, tier.down_hysteresis, tier.ceiling_coeff)
        index = initial_index(tier, rule.initial_steps)
        state[1 + s] = (float(candidates[index] - 1), 0.0, index)  # EMA starts at steps - 1 (183-184)
    return route, ints, floats, state


@njit(cache=True)  # type: ignore[untyped-decorator]
def decide(route: np.ndarray, ints: np.ndarray, state: np.ndarray, batch: int) -> int:
    """activate_step_by_batch: the current steps of the batch's slot."""
    slot = route[min(batch, route.shape[0] - 1)]
    state[0, 1] = slot
    return int(ints[slot, 1 + int(state[1 + slot, 2])])


@njit(cache=True)  # type: ignore[untyped-decorator]
def _recompute(ints: np.ndarray, floats: np.ndarray, state: np.ndarray, slot: int) -> None:
    row = 1 + slot
    n = ints[slot, 0]
    old_idx = int(state[row, 2])
    old_steps = ints[slot, 1 + old_idx]
    ema = state[row, 0]
    up_h, down_h, ceiling_coeff = floats[row, 0], floats[row, 1], floats[row, 2]
    idx = old_idx
    if old_steps == 0:  # 220-227: probe the smallest positive step
        idx = min(idx + 1, n - 1)
        target = ints[slot, 1 + idx]
        if target > 0 and ema < 0:
            state[row, 0] = float(target - 1)
        state[row, 2] = idx
        return
    while idx > 0:  # 230-239
        prev_step = ints[slot, idx]  # candidate idx - 1
        drop = (0.5 if prev_step == 0 else prev_step - 0.5) + down_h
        if ema <= drop:
            idx -= 1
        else:
            break
    if idx >= old_idx:  # 241-249: up only when it did not step down
        while idx < n - 1:
            if ema > ints[slot, 1 + idx] - 0.5 + up_h:
                idx += 1
            else:
                break
    target = ints[slot, 1 + idx]
    if ceiling_coeff > 0:  # 254-259
        ceiling = max(1, math.ceil(ema * ceiling_coeff))
        if target > ceiling and target <= old_steps:
            while idx > 0 and ints[slot, 1 + idx] > ceiling:
                idx -= 1
    state[row, 2] = idx


@njit(cache=True)  # type: ignore[untyped-decorator]
def observe(ints: np.ndarray, floats: np.ndarray, state: np.ndarray, n_verified: int, accepted: int) -> None:
    """on_verify_complete for the step just verified (its drafts were decided by slot state[0, 0]), then the
    decision just taken becomes the one the next step verifies. AdaptiveStepSlot.update (187-211)."""
    slot = int(state[0, 0])
    state[0, 0] = state[0, 1]
    if slot < 0 or n_verified <= 0:  # 193-194: an empty list changes nothing
        return
    row = 1 + slot
    if ints[slot, 1 + int(state[row, 2])] > 0:
        alpha = floats[0, 0]
        state[row, 0] = (1 - alpha) * state[row, 0] + alpha * (accepted / n_verified)
    state[row, 1] += 1
    count = state[row, 1]
    warmup = floats[0, 2]
    if count <= warmup:
        return
    if (count - warmup) % floats[0, 1] != 0:
        return
    _recompute(ints, floats, state, slot)


def replay(
    rule: SglangRule, max_num_seqs: int, batch: np.ndarray, n_verified: np.ndarray, accepted: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The k SGLang's rule gives each step of a recorded sequence, with the slot and its EMA after the step.

    Per step: the scheduled batch size, the requests that verified drafts (decoding requests: the batch minus
    prefills) and their accepted drafts in total. Returns (k, the slot that decided it, and the EMA of the slot the
    step's verification fed, NaN where none: the first step verifies nothing)."""
    route, ints, floats, state = compile_rule(rule, max_num_seqs)
    n = len(batch)
    ks = np.zeros(n, dtype=np.int64)
    slots = np.zeros(n, dtype=np.int64)
    emas = np.zeros(n)
    for t in range(n):
        ks[t] = decide(route, ints, state, int(batch[t]))
        slots[t] = int(state[0, 1])
        fed = int(state[0, 0])
        observe(ints, floats, state, int(n_verified[t]), int(accepted[t]))
        emas[t] = state[1 + fed, 0] if fed >= 0 else np.nan
    return ks, slots, emas
