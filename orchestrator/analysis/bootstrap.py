"""Block bootstrap of ratio estimators from per-block totals.

Requests close in time share queue state, so they are resampled in time blocks (each run cut into equal slices
of its clock; a cell's blocks are the slices its requests fall in), not one by one. A statistic that is a
function of column totals then costs (samples x blocks) per cell, and the block totals of every cell come from
one bincount per column.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orchestrator.analysis.slices import by_slices

_MAX_FLAGS = 3  # 2**3 count bins per block code


def run_blocks(run: np.ndarray, offset_s: np.ndarray, span_s: np.ndarray, blocks_per_run: int) -> np.ndarray:
    """Per row, run * blocks_per_run + which of its run's equal time slices it was scheduled in."""
    with np.errstate(divide="ignore"):
        per_second = np.where(span_s > 0, blocks_per_run / span_s, 0.0)

    def blocks(rows: slice) -> list[np.ndarray]:
        block = np.minimum((offset_s[rows] * per_second[run[rows]]).astype(np.int64), blocks_per_run - 1)
        return [run[rows] * blocks_per_run + block]

    (codes,) = by_slices(len(run), blocks, [np.int64])
    if (span_s == 0).any():
        # A run whose requests share one instant has no time order to keep: spread its rows over the blocks.
        instant = np.flatnonzero(span_s[run] == 0)
        codes[instant] = run[instant] * blocks_per_run + instant % blocks_per_run
    return codes


def add_block_totals(totals: np.ndarray, counts: np.ndarray, codes: np.ndarray, columns: Sequence[np.ndarray]) -> None:
    """Adds the rows' `columns` (any numeric or bool dtype) to `totals` (size, columns) by block code, and the rows
    to `counts`; rows with code `size` are left out. Called slice by slice, so the weights bincount converts to
    float64 stay in cache instead of costing a full-length copy per column."""
    size = len(counts)
    # Bool columns ride along in the row count: one unweighted bincount of (code, flag bits) counts every
    # flag, where each would cost a weighted bincount of its own (the slower kind, and numpy holds the GIL).
    flags = [j for j, column in enumerate(columns) if column.dtype == np.bool_][:_MAX_FLAGS]
    combined = codes.astype(np.int64) << len(flags)
    for bit, j in enumerate(flags):
        combined |= columns[j].view(np.uint8).astype(np.int64) << bit
    by_flags = np.bincount(combined, minlength=(size + 1) << len(flags))[: size << len(flags)]
    by_flags = by_flags.reshape(size, 1 << len(flags))
    counts += by_flags.sum(axis=1)
    patterns = np.arange(1 << len(flags))
    for bit, j in enumerate(flags):
        totals[:, j] += by_flags[:, (patterns >> bit) & 1 == 1].sum(axis=1)
    for j, column in enumerate(columns):
        if j not in flags:
            totals[:, j] += np.bincount(codes, weights=column, minlength=size + 1)[:size]


def block_totals(codes: np.ndarray, columns: Sequence[np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
    """((size, columns) sums per block code, rows per block code); rows with code `size` are left out."""
    totals, counts = np.zeros((size, len(columns))), np.zeros(size, dtype=np.int64)
    add_block_totals(totals, counts, codes, columns)
    return totals, counts


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
