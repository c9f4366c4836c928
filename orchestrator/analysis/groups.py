"""Rows grouped by a small integer code: sums by bincount, quantiles from one sort of the codes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.analysis.parallel import run_parallel

QUANTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class Groups:
    codes: np.ndarray  # per row; rows in no group carry `count`, a bin that sums drop
    order: np.ndarray  # grouped row indices, group after group
    bounds: np.ndarray  # group g's rows are order[bounds[g]:bounds[g + 1]]

    @property
    def count(self) -> int:
        return len(self.bounds) - 1

    def rows(self, group: int) -> np.ndarray:
        rows: np.ndarray = self.order[self.bounds[group] : self.bounds[group + 1]]
        return rows

    def sizes(self) -> np.ndarray:
        sizes: np.ndarray = np.diff(self.bounds)
        return sizes

    def sums(self, values: np.ndarray) -> np.ndarray:
        sums: np.ndarray = np.bincount(self.codes, weights=values, minlength=self.count + 1)[: self.count]
        return sums

    def quantiles(
        self, values: np.ndarray, qs: Sequence[float] = QUANTILES, *, where: np.ndarray | None = None
    ) -> np.ndarray:
        """(groups, len(qs)) percentiles of the finite values (of the rows `where` is true, if given),
        interpolated as numpy's and DuckDB's quantile_cont are; NaN for a group without any."""
        out = np.full((self.count, len(qs)), np.nan)
        fractions = np.asarray(qs, dtype=np.float64) / 100
        for g in range(self.count):
            rows = self.rows(g)
            # Gathered group by group: one group's copy at a time, not a second full-length column.
            segment = values[rows]
            keep = np.isfinite(segment)
            if where is not None:
                keep &= where[rows]
            if not keep.all():
                segment = segment[keep]
            if not len(segment):
                continue
            out[g] = _interpolated(segment, fractions)
        return out

    def quantiles_of(self, columns: Sequence[np.ndarray], qs: Sequence[float] = QUANTILES) -> list[np.ndarray]:
        return run_parallel(*(lambda c=c: self.quantiles(c, qs) for c in columns))


def _interpolated(segment: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """Quantiles at `fractions` of a non-empty array, which is reordered in place."""
    position = fractions * (len(segment) - 1)
    below = np.floor(position).astype(np.int64)
    ranks = np.unique(below)
    # Select only the lower ranks; each next rank up is then the smallest value between its rank and the next
    # selected one, a plain min, where selecting it too would cost another pass of the selection.
    segment.partition(ranks)
    next_value = {}
    for i, rank in enumerate(ranks):
        stop = ranks[i + 1] + 1 if i + 1 < len(ranks) else len(segment)
        next_value[int(rank)] = segment[rank + 1 : stop].min() if rank + 1 < len(segment) else segment[rank]
    low = segment[below]
    high = np.array([next_value[int(b)] for b in below])
    interpolated: np.ndarray = low + (high - low) * (position - below)
    return interpolated


def group_rows(codes: np.ndarray, count: int) -> Groups:
    """Rows with code -1 are left out. A stable sort of 8- or 16-bit codes is a radix sort: linear in rows, one
    pass per byte."""
    width = np.uint8 if count < (1 << 8) - 1 else np.uint16 if count < (1 << 16) - 1 else np.int64
    binned: np.ndarray = np.where(codes >= 0, codes, count).astype(width)
    order = np.argsort(binned, kind="stable")
    bounds = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(binned, minlength=count + 1)[:count], out=bounds[1:])
    return Groups(codes=binned, order=order[: bounds[-1]], bounds=bounds)
