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


@njit(types.uint64(_U64, types.int64, types.int64, types.int64), cache=True, nogil=True)  # type: ignore[untyped-decorator]
def _kth(keys: np.ndarray, lo: int, hi: int, k: int) -> int:  # pragma: no cover
    """The k-th smallest of keys[lo:hi], which it reorders: quickselect with a three-way partition, so runs of
    equal keys (rounded latencies) cost one pass."""
    while hi - lo > 1:
        a, b, c = keys[lo], keys[(lo + hi) // 2], keys[hi - 1]
        pivot: int = max(min(a, b), min(max(a, b), c))  # median of three
        less, i, more = lo, lo, hi
        while i < more:
            key = keys[i]
            if key < pivot:
                keys[i], keys[less] = keys[less], key
                less += 1
                i += 1
            elif key > pivot:
                more -= 1
                keys[i], keys[more] = keys[more], key
            else:
                i += 1
        if k < less - lo:
            hi = less
        elif k < more - lo:
            return pivot
        else:
            k -= more - lo
            lo = more
    found: int = keys[lo]
    return found


# Plain loops only: numpy's sort, unique and fancy indexing would each add seconds to the first compile.
@njit(types.void(_IN_U64, _IN_I64, _IN_I64, _U64), cache=True, nogil=True)  # type: ignore[untyped-decorator]
def _select(keys: np.ndarray, bounds: np.ndarray, ranks: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """out[g * R + j]: the key of rank ranks[g * R + j] within group g (R ranks per group, each below its size)."""
    per_group = len(ranks) // (len(bounds) - 1)
    bins = 1 << _BIN_BITS
    histogram = np.zeros(bins, dtype=np.int64)
    place = np.full(bins, -1, dtype=np.int64)  # where a wanted bin's keys start in `picked`; -1: not wanted
    picked = np.empty(0, dtype=np.uint64)
    rank_bin = np.empty(per_group, dtype=np.int64)
    inside = np.empty(per_group, dtype=np.int64)
    for g in range(len(bounds) - 1):
        start, stop = bounds[g], bounds[g + 1]
        if stop == start:
            continue
        low, high = keys[start], keys[start]
        for i in range(start, stop):
            low = min(low, keys[i])
            high = max(high, keys[i])
        # No more bins than keys: a small group would spend its time clearing an empty histogram.
        used = 1
        while used < stop - start and used < bins:
            used *= 2
        shift = np.uint64(0)
        while ((high - low) >> shift) >= used:
            shift += np.uint64(1)
        histogram[:used] = 0
        for i in range(start, stop):
            histogram[(keys[i] - low) >> shift] += 1
        # Each wanted rank's bin, and its rank inside that bin.
        for j in range(per_group):
            wanted = ranks[g * per_group + j]
            below = 0
            b = 0
            while below + histogram[b] <= wanted:
                below += histogram[b]
                b += 1
            rank_bin[j] = b
            inside[j] = wanted - below
            place[b] = 0
        # The wanted bins' keys, bin after bin (a counting sort restricted to them).
        total = 0
        for b in range(used):
            if place[b] >= 0:
                place[b] = total
                total += histogram[b]
        if len(picked) < total:
            picked = np.empty(total, dtype=np.uint64)
        for i in range(start, stop):
            b = (keys[i] - low) >> shift
            if place[b] >= 0:  # advances as the bin's keys land
                picked[place[b]] = keys[i]
                place[b] += 1
        for j in range(per_group):
            b = rank_bin[j]
            end = place[b]  # advanced past the bin's keys: its start is end - histogram[b]
            out[g * per_group + j] = _kth(picked, end - histogram[b], end, inside[j])
        for j in range(per_group):
            place[rank_bin[j]] = -1


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
