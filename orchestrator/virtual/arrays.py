"""Trace columns for many rows at once: the load worker's per-response arithmetic (loadshapes.sse.latency_columns,
loadshapes.trace.step_summaries, RequestRecord.spec_decode_metrics) over numpy segments, with the same floats (a
simulated hour is ~10^5 rows: one call per row would cost more than the simulation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from serve_apps.sim.request import RequestRecord


def to_ns(start_ns: int, seconds: np.ndarray) -> np.ndarray:
    ns: np.ndarray = start_ns + np.rint(np.asarray(seconds, dtype=np.float64) * 1e9).astype(np.int64)
    return ns


def column(n: int, rows: np.ndarray, values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """A column of n rows holding `values` at `rows` and null elsewhere."""
    full = np.zeros(n, dtype=values.dtype)
    full[rows] = values
    mask = np.ones(n, dtype=bool)
    mask[rows] = False
    return pa.array(full, type=kind, mask=mask)


def list_column(n: int, rows: np.ndarray, lengths: np.ndarray, values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """A list column: row rows[i] holds the next lengths[i] values; other rows are null."""
    counts = np.zeros(n, dtype=np.int64)
    counts[rows] = lengths
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    mask = np.ones(n, dtype=bool)
    mask[rows] = False
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(values, kind.value_type), type=kind, mask=pa.array(mask)
    )


def segments(lengths: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(lengths)), lengths)


def latency_arrays(
    scheduled_ns: np.ndarray, lengths: np.ndarray, times_ns: np.ndarray
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """loadshapes.sse.latency_columns for many rows at once, with the same arithmetic (so the same floats).

    Rows are consecutive segments of times_ns; returns column -> (values, valid) for first token and the
    per-token latencies (ttft_s and e2e_s need the done time, computed by the caller).
    """
    n = len(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    has_token = lengths > 0
    first = np.where(has_token, times_ns[np.minimum(starts, max(len(times_ns) - 1, 0))] if len(times_ns) else 0, 0)
    last = np.where(has_token, times_ns[np.maximum(starts + lengths - 1, 0)] if len(times_ns) else 0, 0)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {
        "first_token_ns": (first, has_token),
        "ttft_s": ((first - scheduled_ns) / 1e9, has_token),
    }
    multi = lengths > 1
    gaps_n = np.maximum(lengths - 1, 0)
    tpot = np.zeros(n)
    tpot[multi] = (last[multi] - first[multi]) / 1e9 / gaps_n[multi]
    out["tpot_s"] = (tpot, multi)
    # Inter-token gaps, sorted within each row: numpy's linear quantile, as sse._quantile computes it.
    segment = segments(lengths)
    diffs = np.diff(times_ns) if len(times_ns) else np.zeros(0, np.int64)
    within = segment[1:] == segment[:-1] if len(segment) else np.zeros(0, bool)
    gaps = diffs[within]
    gap_segment = segment[1:][within]
    if len(gaps) and gaps.min() >= 0 and gaps.max() < 1 << 40 and n < 1 << 22:
        ordered = np.sort((gap_segment << 40) | gaps) & ((1 << 40) - 1)  # one int64 sort: ~4x faster than lexsort
    else:
        ordered = gaps[np.lexsort((gaps, gap_segment))]
    gap_starts = np.concatenate([[0], np.cumsum(gaps_n)[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    for name, q in (("itl_p50_s", 0.5), ("itl_p99_s", 0.99)):
        values = np.zeros(n)
        position = q * (gaps_n[multi] - 1)
        low = position.astype(np.int64)
        high = np.minimum(low + 1, gaps_n[multi] - 1)
        base = gap_starts[multi]
        lo_v, hi_v = ordered[base + low], ordered[base + high]
        values[multi] = (lo_v + (hi_v - lo_v) * (position - low)) / 1e9
        out[name] = (values, multi)
    top = np.zeros(n)
    top[multi] = ordered[gap_starts[multi] + gaps_n[multi] - 1] / 1e9
    out["itl_max_s"] = (top, multi)
    return out


def spec_arrays(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """RequestRecord.spec_decode_metrics() for many records at once: per-step drafted/accepted over the steps
    that verified drafts (vLLM leaves the others out) and the mean acceptance length."""
    drafted = np.concatenate([r.step_drafted for r in records]) if records else np.zeros(0, np.int64)
    accepted = np.concatenate([r.step_accepted for r in records]) if records else np.zeros(0, np.int64)
    lengths = np.fromiter((len(r.step_drafted) for r in records), dtype=np.int64, count=len(records))
    segment = segments(lengths)
    verified = drafted > 0
    steps = np.bincount(segment[verified], minlength=len(records))
    accepted_sum = np.bincount(segment[verified], weights=accepted[verified], minlength=len(records))
    mean_length = np.ones(len(records))
    has = steps > 0
    mean_length[has] = 1.0 + accepted_sum[has] / steps[has]
    return {
        "steps": steps,
        "per_step_drafted": drafted[verified],
        "per_step_accepted": accepted[verified],
        "mean_acceptance_length": mean_length,
    }


def concat(arrays: Sequence[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def step_summary_columns(
    n: int, rows: np.ndarray, lengths: np.ndarray, batch: np.ndarray, executed: np.ndarray
) -> dict[str, pa.Array]:
    """loadshapes.trace.step_summaries for many rows at once (rows[i] holds the next lengths[i] steps)."""
    m = len(lengths)
    segment = segments(lengths)
    batch_sum = np.bincount(segment, weights=batch, minlength=m)
    has = lengths > 0
    mean = np.zeros(m)
    mean[has] = batch_sum[has] / lengths[has]
    top = np.zeros(m, np.int32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if m else np.zeros(0, np.int64)
    if has.any():
        top[has] = np.maximum.reduceat(batch, starts[has])
    return {
        "engine_steps": column(n, rows, lengths.astype(np.int32), pa.int32()),
        "step_batch_mean": column(n, rows[has], mean[has], pa.float64()),
        "step_batch_max": column(n, rows[has], top[has], pa.int32()),
        "step_k_sum": column(n, rows, np.bincount(segment, weights=executed, minlength=m).astype(np.int64), pa.int64()),
    }
