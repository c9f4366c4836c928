"""Per-list sums read straight from Arrow's buffers by a compiled kernel (numba, cached).

numpy needed a null-filled copy of the elements, a 32-bit running sum over all of them and two gathers at the
offsets; the kernel walks each list once. Sums wrap to 32 bits as the running-sum difference did.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

_OUT = types.Array(types.int32, 1, "A")  # a slice of the full-length outputs
_IN_OFFSETS = types.Array(types.int32, 1, "C", readonly=True)
_IN_BITMAP = types.Array(types.uint8, 1, "C", readonly=True)
_SIGNATURES = [
    types.void(types.Array(t, 1, "C", readonly=True), _IN_OFFSETS, _IN_BITMAP, types.int64, types.boolean, _OUT, _OUT)
    for t in (types.int16, types.int32)
]


# Signatures given, so the kernel is compiled (or loaded from numba's cache) at import, not on first use.
@njit(_SIGNATURES, cache=True, nogil=True)  # type: ignore[untyped-decorator]
def sum_lists(  # pragma: no cover
    values: np.ndarray,
    offsets: np.ndarray,
    bitmap: np.ndarray,
    bit_offset: int,
    positive: bool,
    sums: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """List i spans values[offsets[i]:offsets[i + 1]]; an element whose validity bit (at bit_offset + its index,
    when `bitmap` is not empty) is clear counts as 0; `positive` counts the elements above 0 instead."""
    check = len(bitmap) > 0
    for i in range(len(offsets) - 1):
        total = np.int64(0)
        for j in range(offsets[i], offsets[i + 1]):
            if check:
                bit = bit_offset + j
                if not (bitmap[bit >> 3] >> (bit & 7)) & 1:
                    continue
            value = values[j]
            if positive:
                total += value > 0
            else:
                total += value
        sums[i] = np.int32(total)
        lengths[i] = offsets[i + 1] - offsets[i]
