"""The k-switch cost (vLLM #49548): the excess step time, against the fitted model, of a step whose k differs
from its engine's previous step's and of the step after it, with a 95% interval over the switches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.numfmt import signed

Z95 = 1.959964


@dataclass(frozen=True)
class KSwitch:
    switches: int
    excess_s: float  # mean over switches of (measured - predicted), the switching step and the next summed
    low_s: float
    high_s: float


def switch_mask(k: np.ndarray, previous_k: np.ndarray) -> np.ndarray:
    return np.asarray(~np.isnan(k) & ~np.isnan(previous_k) & (k != previous_k), dtype=bool)


def after_switch(k: np.ndarray, previous_k: np.ndarray) -> np.ndarray:
    """Steps a switch may have slowed: the switching step and the one after it (same engine: the mask is
    computed on steps sorted by unit, engine and time, and a unit's first step has no previous k)."""
    switched = switch_mask(k, previous_k)
    following = np.zeros_like(switched)
    following[1:] = switched[:-1] & ~np.isnan(previous_k[1:])
    return np.asarray(switched | following, dtype=bool)


def k_switch_cost(residual: np.ndarray, k: np.ndarray, previous_k: np.ndarray) -> KSwitch | None:
    """`residual`: measured - predicted seconds per step. None where k never changed."""
    switched = np.flatnonzero(switch_mask(k, previous_k))
    if not len(switched):
        return None
    nxt = switched + 1
    has_next = (nxt < len(residual)) & ~np.isnan(previous_k[np.minimum(nxt, len(residual) - 1)])
    excess = residual[switched] + np.where(has_next, residual[np.minimum(nxt, len(residual) - 1)], 0.0)
    mean = float(excess.mean())
    half = Z95 * float(excess.std(ddof=1)) / np.sqrt(len(excess)) if len(excess) > 1 else float("inf")
    return KSwitch(switches=len(excess), excess_s=mean, low_s=mean - half, high_s=mean + half)


def describe(s: KSwitch) -> str:
    return (
        # signed(): a cost that rounds to zero prints "0.000", never "-0.000"
        f"k-switch cost {signed(s.excess_s * 1e3, 3)} ms per switch [{signed(s.low_s * 1e3, 3)}, "
        f"{signed(s.high_s * 1e3, 3)}] "
        f"over {s.switches} switches"
    )
