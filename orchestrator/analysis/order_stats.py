"""Exact quantiles per group by histogram selection, in compiled kernels (numba, cached).

A partition (introselect) of every group costs tens of nanoseconds per value. Here each value becomes an
order-preserving integer key; one histogram pass over a group's keys finds the bins that hold the ranks wanted,
and only those bins' few keys are sorted. The values at the ranks are exact order statistics; interpolating
between them gives DuckDB's quantile_cont and numpy's linear percentile (up to numpy's last-bit rounding).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, types

QUANTILES = (50.0, 90.0, 99.0)
_SIGN = np.uint64(1 << 63)
_BIN_BITS = 16  # 65536 bins: a group's keys spread over them, so the bins holding the ranks stay small

_U64, _I64 = (types.Array(t, 1, "C") for t in (types.uint64, types.int64))
# Inputs read-only in the signatures: a writable array matches them too.
_IN_U64, _IN_I64, _IN_I32, _IN_BOOL = (
    types.Array(t, 1, "C", readonly=True) for t in (types.uint64, types.int64, types.int32, types.boolean)
)


# Signatures given, so the kernels are compiled (or loaded from numba's cache) at import, not on first use.
@njit(types.void(_IN_U64, _IN_I32, _IN_BOOL, _I64, _U64), cache=True, nogil=True)  # type: ignore[untyped-decorator]
def _gather(
    bits: np.ndarray, group: np.ndarray, where: np.ndarray, bounds: np.ndarray, keys: np.ndarray
) -> None:  # pragma: no cover
    """Keys of the finite values (where `where` holds, if it is not empty) of rows with group >= 0, group after
    group: a counting sort, `bounds` the groups' starts (len groups + 1), filled here."""
    groups = len(bounds) - 1
    counts = np.zeros(groups + 1, dtype=np.int64)
    check = len(where) > 0
    for i in range(len(bits)):
        g = group[i]
        if g >= 0 and ((bits[i] >> 52) & 0x7FF) != 0x7FF and (not check or where[i]):
            counts[g + 1] += 1
    bounds[0] = 0
    for g in range(groups):
        bounds[g + 1] = bounds[g] + counts[g + 1]
    at = bounds[:-1].copy()
    for i in range(len(bits)):
        g = group[i]
        if g >= 0 and ((bits[i] >> 52) & 0x7FF) != 0x7FF and (not check or where[i]):
            b = bits[i]
            # Negative floats order reversed and below the positives: flip them whole, else set the sign bit.
            keys[at[g]] = ~b if b >> 63 else b | (np.uint64(1) << np.uint64(63))
            at[g] += 1


@njit(types.void(_IN_U64, _IN_I64, _IN_I64, _U64), cache=True, nogil=True)  # type: ignore[untyped-decorator]
def _select(keys: np.ndarray, bounds: np.ndarray, ranks: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """out[g * R + j]: the key of rank ranks[g * R + j] within group g (R ranks per group, each below its size)."""
    per_group = len(ranks) // (len(bounds) - 1)
    bins = 1 << _BIN_BITS
    histogram = np.zeros(bins, dtype=np.int64)
    marked = np.zeros(bins, dtype=np.bool_)
    for g in range(len(bounds) - 1):
        segment = keys[bounds[g] : bounds[g + 1]]
        if len(segment) == 0:
            continue
        low = segment.min()
        span = segment.max() - low
        # No more bins than keys: a small group would spend its time clearing an empty histogram.
        used = 1
        while used < len(segment) and used < bins:
            used *= 2
        shift = np.uint64(0)
        while (span >> shift) >= used:
            shift += np.uint64(1)
        histogram[:used] = 0
        for k in segment:
            histogram[(k - low) >> shift] += 1
        # Each wanted rank's bin, and its rank inside that bin.
        wanted = ranks[g * per_group : (g + 1) * per_group]
        rank_bin = np.empty(per_group, dtype=np.int64)
        inside = np.empty(per_group, dtype=np.int64)
        for j in range(per_group):
            below = 0
            b = 0
            while below + histogram[b] <= wanted[j]:
                below += histogram[b]
                b += 1
            rank_bin[j] = b
            inside[j] = wanted[j] - below
        chosen = np.unique(rank_bin)
        marked[chosen] = True
        picked = np.empty(histogram[chosen].sum(), dtype=np.uint64)
        n = 0
        for k in segment:
            if marked[(k - low) >> shift]:
                picked[n] = k
                n += 1
        marked[chosen] = False
        picked.sort()
        for j in range(per_group):
            start = 0
            for c in chosen:
                if c == rank_bin[j]:
                    break
                start += histogram[c]
            out[g * per_group + j] = picked[start + inside[j]]


def _floats(keys: np.ndarray) -> np.ndarray:
    bits = np.where(keys & _SIGN, keys & ~_SIGN, ~keys)
    values: np.ndarray = bits.view(np.float64)
    return values


def grouped_quantiles(
    values: np.ndarray,
    group: np.ndarray,
    groups: int,
    qs: Sequence[float] = QUANTILES,
    *,
    where: np.ndarray | None = None,
) -> np.ndarray:
    """(groups, len(qs)) percentiles of the finite float64 `values` per group code (-1: no group), of the rows
    `where` is true if given, linearly interpolated; NaN for a group without any."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    mask = np.zeros(0, dtype=np.bool_) if where is None else np.ascontiguousarray(where, dtype=np.bool_)
    bounds = np.empty(groups + 1, dtype=np.int64)
    keys = np.empty(len(values), dtype=np.uint64)
    _gather(bits, np.ascontiguousarray(group, dtype=np.int32), mask, bounds, keys)
    sizes = np.diff(bounds)
    position = np.asarray(qs, dtype=np.float64) / 100 * np.maximum(sizes - 1, 0)[:, None]
    below = np.floor(position).astype(np.int64)
    above = np.minimum(below + 1, np.maximum(sizes - 1, 0)[:, None])
    ranks = np.concatenate([below, above], axis=1)
    stats = np.zeros(ranks.size, dtype=np.uint64)
    _select(keys, bounds, np.ascontiguousarray(ranks.ravel()), stats)
    ordered = _floats(stats).reshape(groups, -1)
    low, high = ordered[:, : len(qs)], ordered[:, len(qs) :]
    out: np.ndarray = low + (high - low) * (position - below)
    out[sizes == 0] = np.nan
    return out
