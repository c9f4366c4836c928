"""Rows into runs by a dense (arm, shape, run, repeat) key, in two compiled passes (numba, cached).

numpy built the key twice (once to count, once to remap), each a few full-length int64 temporaries, then a
scatter-min and scatter-max for the runs' first and last requests and a third pass for the offsets; the first
kernel counts the keys and finds each run's first and last request at once, the second writes each row's run and
its offset on the run's clock.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

_I64, _F64 = (types.Array(t, 1, "C") for t in (types.int64, types.float64))
# Inputs may be read-only (Arrow buffers seen through numpy): a writable array matches these too.
_IN32, _IN64 = (types.Array(t, 1, "C", readonly=True) for t in (types.int32, types.int64))
_SIZES = types.UniTuple(types.int64, 4)


# Signatures given, so the kernels are compiled (or loaded from numba's cache) at import, not on first use.
@njit(types.int64(_IN32, _IN32, _IN32, _IN64, _SIZES, types.int64), cache=True, nogil=True, inline="always")  # type: ignore[untyped-decorator]
def _key(  # pragma: no cover
    arm: np.ndarray, shape: np.ndarray, run: np.ndarray, repeat: np.ndarray, sizes: tuple[int, int, int, int], i: int
) -> int:
    # Codes are -1 for null: shifted by one, nulls get their own slot.
    key: int = (((arm[i] + 1) * sizes[1] + shape[i] + 1) * sizes[2] + run[i] + 1) * sizes[3] + repeat[i] + 1
    return key


@njit(types.void(_IN32, _IN32, _IN32, _IN64, _SIZES, _IN64, _I64, _I64, _I64), cache=True, nogil=True)  # type: ignore[untyped-decorator]
def key_spans(
    arm: np.ndarray,
    shape: np.ndarray,
    run: np.ndarray,
    repeat: np.ndarray,
    sizes: tuple[int, int, int, int],
    scheduled: np.ndarray,
    rows: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
) -> None:  # pragma: no cover
    """Per key: rows, and the first and last scheduled time (first/last preset to int64 max/min)."""
    for i in range(len(arm)):
        key = _key(arm, shape, run, repeat, sizes, i)
        rows[key] += 1
        first[key] = min(first[key], scheduled[i])
        last[key] = max(last[key], scheduled[i])


@njit(types.void(_IN32, _IN32, _IN32, _IN64, _SIZES, _IN64, _IN64, _IN64, _I64, _F64), cache=True, nogil=True)  # type: ignore[untyped-decorator]
def place_rows(
    arm: np.ndarray,
    shape: np.ndarray,
    run: np.ndarray,
    repeat: np.ndarray,
    sizes: tuple[int, int, int, int],
    scheduled: np.ndarray,
    remap: np.ndarray,
    start: np.ndarray,
    group: np.ndarray,
    offset_s: np.ndarray,
) -> None:  # pragma: no cover
    """Per row: its run (remap[key]) and its scheduled time in seconds since that run's start."""
    for i in range(len(arm)):
        g = remap[_key(arm, shape, run, repeat, sizes, i)]
        group[i] = g
        offset_s[i] = np.float64(scheduled[i] - start[g]) / 1e9
