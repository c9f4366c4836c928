"""Block bootstrap of ratio estimators from per-block totals.

Requests close in time share queue state, so they are resampled in time blocks (each run cut into equal slices
of its clock; a cell's blocks are the slices its requests fall in), not one by one. A statistic that is a
function of column totals then costs (samples x blocks) per cell, and the block totals of every cell come from
one GROUP BY (orchestrator/analysis/opmap.py).
"""

from __future__ import annotations

import numpy as np


def merge_blocks(totals: np.ndarray, max_blocks: int) -> np.ndarray:
    """At most `max_blocks` rows, each the sum of neighbouring blocks, to bound the resampling cost."""
    if len(totals) <= max_blocks:
        return totals
    width = -(-len(totals) // max_blocks)
    padded = np.zeros((width * -(-len(totals) // width), totals.shape[1]))
    padded[: len(totals)] = totals
    merged: np.ndarray = padded.reshape(-1, width, totals.shape[1]).sum(axis=1)
    return merged


def resampled_totals(totals: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """(samples, columns): column totals of `samples` resamples of the blocks (rows of `totals`), with replacement."""
    blocks = len(totals)
    picks = rng.integers(0, blocks, size=(samples, blocks)) + blocks * np.arange(samples)[:, None]
    times_drawn = np.bincount(picks.ravel(), minlength=samples * blocks).reshape(samples, blocks)
    resampled: np.ndarray = times_drawn.astype(np.float64) @ totals
    return resampled


def interval(values: np.ndarray, confidence: float, max_undefined: float = 0.05) -> tuple[float, float] | None:
    """Percentile interval, or None when too many resamples leave the statistic undefined."""
    finite = values[np.isfinite(values)]
    if len(finite) < (1 - max_undefined) * len(values) or not len(finite):
        return None
    tail = 50 * (1 - confidence)
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)
