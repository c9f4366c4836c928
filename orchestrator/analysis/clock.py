"""Each row's place on its run's clock, and the offered arrival rate there.

A run of one shape on one arm is the rows sharing (arm, shape, run, repeat). Its clock starts at the start the
caller passes for it, else at its first scheduled request (the schedule's first arrival, a fraction of a second
after the real start at any non-trivial rate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadshapes.shapes import _Shape as ShapeLike
from orchestrator.analysis.parallel import run_parallel
from orchestrator.analysis.request_ids import ParsedIds, parse_request_ids
from orchestrator.analysis.run_rows import key_spans, place_rows
from orchestrator.analysis.slices import by_slices, row_slices

RunKey = tuple[str, str, str, int]  # arm, shape, run, repeat (-1: the id did not name one)


@dataclass(frozen=True)
class Codes:
    """A string column as integer codes into `names`; -1 for null."""

    names: tuple[str, ...]
    codes: np.ndarray


def encode(column: pa.ChunkedArray | pa.Array) -> Codes:
    encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
    chunked = encoded if isinstance(encoded, pa.ChunkedArray) else pa.chunked_array([encoded])
    chunked = chunked.unify_dictionaries()
    if chunked.num_chunks == 0:
        return Codes(names=(), codes=np.zeros(0, dtype=np.int32))
    names = tuple(str(v) for v in chunked.chunk(0).dictionary.to_pylist())
    codes = np.empty(len(chunked), dtype=np.int32)
    start = 0
    for chunk in chunked.chunks:
        codes[start : start + len(chunk)] = chunk.indices.fill_null(-1).to_numpy()
        start += len(chunk)
    return Codes(names=names, codes=codes)


@dataclass(frozen=True)
class RunClock:
    arm: Codes
    shape: Codes
    ids: ParsedIds
    run: np.ndarray  # per row: index into `runs`
    runs: tuple[RunKey, ...]
    offset_s: np.ndarray  # per row: scheduled time, seconds since its run's start
    start_ns: np.ndarray  # per run
    span_s: np.ndarray  # per run: first to last scheduled request
    rows: np.ndarray  # per run


def _int32(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int32)  # no copy when already so


def _int64(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


def _run_groups(fields: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys, run per row) for rows keyed by small codes; a counting pass over a dense key space.

    Field values are codes with -1 for null, each shifted by one so nulls form their own slot."""

    def keys(rows: slice) -> np.ndarray:
        key = np.zeros(rows.stop - rows.start, dtype=np.int64)
        for values, size in fields:
            key *= size
            key += values[rows]
            key += 1
        return key

    rows = len(fields[0][0])
    domain = int(np.prod([size for _, size in fields]))
    if domain > 4 * rows + 4096:
        present, run = np.unique(keys(slice(0, rows)), return_inverse=True)
        return present, run
    seen = np.zeros(domain, dtype=np.int64)
    for part in row_slices(rows):
        seen += np.bincount(keys(part), minlength=domain)
    present = np.flatnonzero(seen)
    remap = np.zeros(domain, dtype=np.int64)
    remap[present] = np.arange(len(present))
    (group,) = by_slices(rows, lambda part: [remap[keys(part)]], [np.int64])
    return present, group


def run_clock(table: pa.Table, *, run_starts: Mapping[RunKey, int] | None = None) -> RunClock:
    ids, arm, shape, run, scheduled = run_parallel(
        lambda: parse_request_ids(table["request_id"]),
        lambda: encode(table["arm"]),
        lambda: encode(table["shape"]),
        lambda: encode(table["run"]),
        lambda: table["scheduled_ns"].to_numpy().astype(np.int64, copy=False),
    )
    # Null / unparsed values are code -1: shift every field by one so they form their own slot.
    fields = [
        (arm.codes, len(arm.names) + 1),
        (shape.codes, len(shape.names) + 1),
        (run.codes, len(run.names) + 1),
        (ids.repeat, int(ids.repeat.max(initial=-1)) + 2),
    ]
    sizes = tuple(size for _, size in fields)
    domain = int(np.prod(sizes))
    rows = len(scheduled)
    dense = domain <= 4 * rows + 4096
    if dense:
        # Counted and placed by the compiled passes: no full-length key array, no scatter-min/max.
        columns = (_int32(arm.codes), _int32(shape.codes), _int32(run.codes), _int64(ids.repeat))
        counts = np.zeros(domain, dtype=np.int64)
        first_by_key = np.full(domain, np.iinfo(np.int64).max, dtype=np.int64)
        last_by_key = np.full(domain, np.iinfo(np.int64).min, dtype=np.int64)
        key_spans(*columns, sizes, scheduled, counts, first_by_key, last_by_key)
        present = np.flatnonzero(counts)
        first, last = first_by_key[present], last_by_key[present]
    else:
        present, group = _run_groups(fields)
        first = np.full(len(present), np.iinfo(np.int64).max, dtype=np.int64)
        last = np.full(len(present), np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(first, group, scheduled)
        np.maximum.at(last, group, scheduled)
    decoded = []
    rest = present.copy()
    for _, size in reversed(fields):
        decoded.append(rest % size - 1)
        rest //= size
    repeat_c, run_c, shape_c, arm_c = decoded

    def name(names: tuple[str, ...], code: int) -> str:
        return names[code] if code >= 0 else ""

    runs = tuple(
        (name(arm.names, int(a)), name(shape.names, int(s)), name(run.names, int(r)), int(p))
        for a, s, r, p in zip(arm_c, shape_c, run_c, repeat_c, strict=True)
    )
    start = first.copy()
    for i, run_key in enumerate(runs):
        if run_starts and run_key in run_starts:
            start[i] = run_starts[run_key]
    if dense:
        remap = np.zeros(domain, dtype=np.int64)
        remap[present] = np.arange(len(present))
        group, offset_s = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.float64)
        place_rows(*columns, sizes, scheduled, remap, start, group, offset_s)
    else:
        (offset_s,) = by_slices(
            rows, lambda part: [(scheduled[part] - start[group[part]]).astype(np.float64) / 1e9], [np.float64]
        )
    return RunClock(
        arm=arm,
        shape=shape,
        ids=ids,
        run=group,
        runs=runs,
        offset_s=offset_s,
        start_ns=start,
        span_s=(last - first) / 1e9,
        rows=np.bincount(group, minlength=len(present)),
    )


def offered_rates_at(clock: RunClock, shapes: Mapping[str, ShapeLike]) -> np.ndarray:
    """Requests per second the shape offered at each row's scheduled time; NaN for shapes not given."""
    given = {
        code: shape
        for code, name in enumerate(clock.shape.names)
        if (shape := shapes.get(name)) is not None and shape.open_loop
    }

    def rates(rows: slice) -> list[np.ndarray]:
        codes, offsets = clock.shape.codes[rows], clock.offset_s[rows]
        # Rows come partition by partition, so a slice is mostly of one shape: no mask gather and scatter then.
        only = int(codes[0]) if len(codes) else -1
        if only in given and (codes == only).all():
            return [np.asarray(given[only].rate_at(offsets), dtype=np.float64)]
        out = np.full(rows.stop - rows.start, np.nan)
        for code, shape in given.items():
            mine = codes == code
            out[mine] = shape.rate_at(offsets[mine])
        return [out]

    (offered,) = by_slices(len(clock.offset_s), rates, [np.float64])
    return offered


def offered_rates(
    table: pa.Table, shapes: Mapping[str, ShapeLike], *, run_starts: Mapping[RunKey, int] | None = None
) -> np.ndarray:
    """Per row: the offered arrival rate (req/s) of its shape at its scheduled time; NaN where unknown."""
    return offered_rates_at(run_clock(table, run_starts=run_starts), shapes)
