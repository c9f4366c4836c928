"""Band codes by binary search over the bands' edges, compiled (numba, cached): numpy's searchsorted plus the
parity arithmetic made three full-length temporaries per slice; the kernel writes each code once."""

from __future__ import annotations

import numpy as np
from numba import njit, types

_IN_F64 = types.Array(types.float64, 1, "C", readonly=True)


# Signature given, so the kernel is compiled (or loaded from numba's cache) at import, not on first use.
@njit(types.void(_IN_F64, _IN_F64, types.Array(types.int32, 1, "C")), cache=True, nogil=True)  # type: ignore[untyped-decorator]
def band_of(values: np.ndarray, edges: np.ndarray, codes: np.ndarray) -> None:  # pragma: no cover
    """codes[i]: i's band when 2 * band + 1 edges are at or below values[i] (inside [low, high) of that band),
    else -1; NaN is at or above no edge, so it lands outside every band."""
    for i in range(len(values)):
        value = values[i]
        lo, hi = 0, len(edges)  # count the edges <= value: the first index whose edge is above it
        while lo < hi:
            mid = (lo + hi) // 2
            if edges[mid] <= value:
                lo = mid + 1
            else:
                hi = mid
        codes[i] = lo >> 1 if lo & 1 else -1
