"""Block bootstrap of ratio estimators from per-block totals.

Requests close in time share queue state, so they are resampled in time blocks (each run cut into equal slices
of its clock; a cell's blocks are the slices its requests fall in), not one by one. A statistic that is a
function of column totals then costs (samples x blocks) per cell, and the block totals of every cell come from
one GROUP BY (orchestrator/analysis/opmap/operating_map.py).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def between_runs_interval(
    point: float, sides: Sequence[tuple[np.ndarray, int]], confidence: float, max_undefined: float = 0.05
) -> tuple[float, float] | None:
    """A ratio of two independent runs: point x exp(-/+ t SE) with Welch's degrees of freedom. `sides`: per run,
    the ratio resampled over that run's blocks alone (the other run held at its totals) and how many blocks it
    has. A run holds few blocks as long as the dependence between its requests, where a percentile interval of
    a handful of blocks is far too narrow: each side's variance is the bootstrap's times n / (n - 1) (unbiased),
    and Student's t widens the interval for how few blocks there are. None: a side of one block, or too many
    resamples leave the ratio undefined."""
    from scipy.special import stdtrit  # only compare needs it: not an import of every report

    if not np.isfinite(point) or point <= 0:
        return None
    variances, dfs = [], []
    for values, blocks in sides:
        logs = np.log(values[np.isfinite(values) & (values > 0)])
        if blocks < 2 or len(logs) < (1 - max_undefined) * len(values):
            return None
        variances.append(float(np.var(logs)) * blocks / (blocks - 1))
        dfs.append(blocks - 1)
    total = sum(variances)
    if total <= 0:
        return point, point
    df = total**2 / sum(v**2 / d for v, d in zip(variances, dfs, strict=True))
    half = float(stdtrit(df, 0.5 + confidence / 2)) * np.sqrt(total)
    return float(point * np.exp(-half)), float(point * np.exp(half))
