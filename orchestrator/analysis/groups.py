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

    def quantiles(self, values: np.ndarray, qs: Sequence[float] = QUANTILES) -> np.ndarray:
        """(groups, len(qs)) percentiles of the finite values, interpolated as numpy's and DuckDB's quantile_cont
        are; NaN for a group without any."""
        ordered = values[self.order]
        out = np.full((self.count, len(qs)), np.nan)
        fractions = np.asarray(qs, dtype=np.float64) / 100
        for g in range(self.count):
            segment = ordered[self.bounds[g] : self.bounds[g + 1]]
            finite = np.isfinite(segment)
            if not finite.all():
                segment = segment[finite]
            if not len(segment):
                continue
            position = fractions * (len(segment) - 1)
            below = np.floor(position).astype(np.int64)
            above = np.minimum(below + 1, len(segment) - 1)
            # One selection for all the ranks needed, in place on the gathered copy.
            segment.partition(np.unique(np.concatenate([below, above])))
            out[g] = segment[below] + (segment[above] - segment[below]) * (position - below)
        return out

    def quantiles_of(self, columns: Sequence[np.ndarray], qs: Sequence[float] = QUANTILES) -> list[np.ndarray]:
        return run_parallel(*(lambda c=c: self.quantiles(c, qs) for c in columns))


def group_rows(codes: np.ndarray, count: int) -> Groups:
    """Rows with code -1 are left out. A stable sort of 16-bit codes is a radix sort: linear in rows."""
    binned = np.where(codes >= 0, codes, count)
    order = np.argsort(binned.astype(np.int16) if count < (1 << 15) - 1 else binned, kind="stable")
    bounds = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(binned, minlength=count + 1)[:count], out=bounds[1:])
    return Groups(codes=binned, order=order[: bounds[-1]], bounds=bounds)
