"""Whole-column arithmetic done slice by slice into preallocated outputs.

A numpy expression over ten million rows makes a fresh full-length temporary per operation; on this kind of
machine first-touching those pages (kernel time) costs more than the arithmetic. Slices of a million rows
keep the temporaries in cache and let the allocator hand the same memory back slice after slice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
from numpy.typing import DTypeLike

SLICE_ROWS = 1 << 20


def row_slices(rows: int, size: int = SLICE_ROWS) -> Iterator[slice]:
    for start in range(0, rows, size):
        yield slice(start, min(start + size, rows))


def by_slices(
    rows: int, compute: Callable[[slice], Sequence[np.ndarray]], dtypes: Sequence[DTypeLike]
) -> list[np.ndarray]:
    """Full-length outputs of `compute`, called on consecutive row slices (each result as long as its slice)."""
    outputs = [np.empty(rows, dtype=dtype) for dtype in dtypes]
    for part in row_slices(rows):
        for out, values in zip(outputs, compute(part), strict=True):
            out[part] = values
    return outputs
