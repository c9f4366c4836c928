"""TensorRT-LLM's acceptance gate (`acceptance_rate_window_size` + `acceptance_rate_threshold`): off for good.

Read from TensorRT-LLM's stored main (2026): tensorrt_llm/_torch/speculative/speculation_gate.py,
SpeculationGate.record_acceptance_rate (the per-iteration version, after PR #12905 renamed the settings): one
sample per speculating iteration, sum(accepted drafts) / sum(drafted) over the generation requests that drafted
(PyExecutor._update_batch_acceptance_rate); the deque keeps the last `window` samples (sum += new, then -= the
one that leaves); once `window` samples were recorded, a mean below the threshold disables speculation for good
(later calls return at once). PyExecutor's overlap loop (the default) records batch N-1 after launching batch
N, so a decision never sees the iteration verified just before it: the simulated engine decides a step's k
before it observes the step.

Arrays: floats[0] = [window, threshold]; state[0] = [disabled, samples recorded, rolling sum, next ring slot],
state[1 + i, 0] = the ring of the last `window` samples.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from serve_apps.resolved import GateRule


def compile_gate(rule: GateRule) -> tuple[np.ndarray, np.ndarray]:
    floats = np.array([[float(rule.window), rule.threshold]])
    state = np.zeros((1 + rule.window, 4))
    return floats, state


@njit(cache=True)  # type: ignore[untyped-decorator]
def decide(table: np.ndarray, state: np.ndarray, batch: int) -> int:
    if state[0, 0] > 0:
        return 0
    return int(table[min(batch, table.shape[0] - 1)])


@njit(cache=True)  # type: ignore[untyped-decorator]
def observe(floats: np.ndarray, state: np.ndarray, drafted: int, accepted: int) -> None:
    """record_acceptance_rate for one iteration that drafted (a step whose requests verified drafts)."""
    if state[0, 0] > 0 or drafted <= 0:
        return
    window = int(floats[0, 0])
    rate = accepted / drafted
    slot = int(state[0, 3])
    state[0, 2] += rate
    if state[0, 1] >= window:  # the deque is full: its oldest sample leaves (popleft)
        state[0, 2] -= state[1 + slot, 0]
    state[1 + slot, 0] = rate
    state[0, 3] = (slot + 1) % window
    state[0, 1] += 1
    if state[0, 1] >= window:
        held = min(state[0, 1], window)
        if state[0, 2] / held < floats[0, 1]:
            state[0, 0] = 1.0


def replay_gate(
    rule: GateRule, table: list[int], batch: np.ndarray, drafted: np.ndarray, accepted: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The k the gate gives each step of a recorded sequence (decided before the step's own verification, as
    the overlap loop does), and whether the gate is shut after the step."""
    floats, state = compile_gate(rule)
    table_array = np.asarray(table, dtype=np.int64)
    ks = np.zeros(len(batch), dtype=np.int64)
    shut = np.zeros(len(batch), dtype=np.bool_)
    for t in range(len(batch)):
        ks[t] = decide(table_array, state, int(batch[t]))
        observe(floats, state, int(drafted[t]), int(accepted[t]))
        shut[t] = state[0, 0] > 0
    return ks, shut
