"""Per-request arithmetic of the request frame in compiled loops (numba, cached): each numpy expression here
made several full-length temporaries (gathers, masks, where) for one output."""

from __future__ import annotations

import numpy as np
from numba import njit, types

_IN_F64, _IN_I64, _IN_I32 = (types.Array(t, 1, "C", readonly=True) for t in (types.float64, types.int64, types.int32))
_F64 = types.Array(types.float64, 1, "C")


# Signatures given, so the kernels are compiled (or loaded from numba's cache) at import, not on first use.
@njit(types.void(_IN_F64, _IN_I64, _IN_F64, types.float64, _F64), cache=True, nogil=True)  # type: ignore[untyped-decorator]
def clock_seconds_of(  # pragma: no cover
    offered: np.ndarray, run: np.ndarray, mean_rate: np.ndarray, max_stretch: float, out: np.ndarray
) -> None:
    """1 / the rate each request stands for: its offered rate (at least its run's mean rate / max_stretch)
    where known and positive, else its run's mean rate; 0 where that rate is not a positive number."""
    for i in range(len(offered)):
        rate = mean_rate[run[i]]
        value = offered[i]
        if np.isfinite(value) and value > 0:
            floor = rate / max_stretch
            rate = floor if np.isnan(floor) or floor > value else value  # np.maximum: NaN wins
        out[i] = 1.0 / rate if np.isfinite(rate) and rate > 0 else 0.0


@njit(types.void(_IN_I32, _IN_I32, _F64), cache=True, nogil=True)  # type: ignore[untyped-decorator]
def mean_of_sums(sums: np.ndarray, counts: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """sums / counts, NaN where the count is 0."""
    for i in range(len(sums)):
        out[i] = np.float64(sums[i]) / np.float64(counts[i]) if counts[i] > 0 else np.nan
