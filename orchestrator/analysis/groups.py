"""Rows grouped by a small integer code: sums by bincount, each group's rows from one sort of the codes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


def group_rows(codes: np.ndarray, count: int) -> Groups:
    """Rows with code -1 are left out. A stable sort of 8- or 16-bit codes is a radix sort: linear in rows, one
    pass per byte."""
    width = np.uint8 if count < (1 << 8) - 1 else np.uint16 if count < (1 << 16) - 1 else np.int64
    binned: np.ndarray = np.where(codes >= 0, codes, count).astype(width)
    order = np.argsort(binned, kind="stable")
    bounds = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(binned, minlength=count + 1)[:count], out=bounds[1:])
    return Groups(codes=binned, order=order[: bounds[-1]], bounds=bounds)
