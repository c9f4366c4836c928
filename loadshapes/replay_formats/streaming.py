"""The formats with request lengths (azure, burstgpt, mooncake): read in two streamed passes.

Reading is in two passes so that a worker never holds a whole multi-million-row file: `read_arrivals` streams the
file and keeps the arrival times of the rows inside the window (every worker needs them all: request i is the
i-th arrival of the window), checking those rows' lengths without keeping them; `read_contents` streams it again
and keeps the lengths of the rows the caller asks for (a worker's share). Both stop at the end of the window when
the file is in time order, as the public traces are. pyarrow's streaming CSV and JSON readers do the parsing (in
C++, a block at a time); a batch that fails to convert or check sends the reader through the file again line by
line (lines.bounded_lines), only to name the line and field of the first bad row in one line.
"""

from __future__ import annotations

import posixpath
from abc import abstractmethod
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadshapes import limits
from loadshapes.replay_formats.base import NS, Arrivals, Contents, ReplayFormat, TraceError, in_window, window
from loadshapes.replay_formats.lines import bounded_lines


class StreamedFormat(ReplayFormat):
    """A trace with lengths, streamed in batches; a format supplies the reading and the columns' conversion."""

    has_lengths = True
    # Whether rows carry prefix blocks (Mooncake's hash_ids).
    prefix_blocks: ClassVar[bool] = False

    @abstractmethod
    def batches(self, path: str) -> Generator[tuple[int, pa.RecordBatch], None, None]:
        """(first data row, batch) of the columns replay uses; a parse error raises `locate`'s one line."""

    @abstractmethod
    def arrival_columns(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        """(arrival ns, failed) of a batch; raises ValueError or ArrowInvalid at a bad value."""

    @abstractmethod
    def length_columns(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """(prompt tokens, output tokens, rule keys and prefix blocks by name) of a batch; raises at a bad value."""

    @abstractmethod
    def first_bad_row(self, lines: Iterator[str], path: str) -> str | None:
        """`line: field: what is wrong` of the first bad row, the same rules as the batch checks (None: none)."""

    def read_arrivals(
        self, paths: Sequence[str], *, start_s: float, duration_s: float | None, keep_failed: bool,
        column: str | None, arm: str | None, shape: str | None,
    ) -> Arrivals:  # fmt: skip
        if column is not None or arm is not None or shape is not None:
            raise TraceError(f"{paths[0]}: column, arm and shape apply to csv and specdrill traces, not {self.name}")
        return _stream_arrivals(paths, self, start_s, duration_s, keep_failed)

    def read_contents(self, paths: Sequence[str], files: np.ndarray, rows: np.ndarray) -> Contents:
        files = np.asarray(files, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        prompts = np.zeros(len(rows), np.int64)
        outputs = np.zeros(len(rows), np.int64)
        labels = {key: np.empty(len(rows), dtype=object) for key in self.rule_keys}
        hash_ids: list[np.ndarray] | None = [np.zeros(0, np.int64)] * len(rows) if self.prefix_blocks else None
        for f in np.unique(files):
            at = np.flatnonzero(files == f)
            part = _contents_of(paths[int(f)], self, rows[at])
            prompts[at] = part.prompt_tokens
            outputs[at] = part.output_tokens
            for key, values in part.labels.items():
                labels[key][at] = values
            if hash_ids is not None and part.hash_ids is not None:
                for position, ids in zip(at, part.hash_ids, strict=True):
                    hash_ids[int(position)] = ids
        return Contents(prompt_tokens=prompts, output_tokens=outputs, labels=labels, hash_ids=hash_ids)


def _contents_of(path: str, fmt: StreamedFormat, rows: np.ndarray) -> Contents:
    """read_contents of one file: one pass, stopped at the last row asked for."""
    wanted = np.unique(rows)
    found: dict[str, list[Any]] = {}
    if len(wanted):
        for first, batch in fmt.batches(path):
            lo, hi = np.searchsorted(wanted, [first, first + batch.num_rows])
            if lo < hi:
                picked = batch.take(pa.array(wanted[lo:hi] - first))
                for name, values in contents_columns(path, fmt, picked).items():
                    found.setdefault(name, []).append(values)
            if hi == len(wanted):
                break  # every row asked for is read: the rest of the file is not
    where = np.searchsorted(wanted, rows)

    def column(name: str) -> np.ndarray:
        parts = found.get(name, [])
        return (np.concatenate(parts) if parts else np.zeros(0))[where]

    labels = {key: column(key) for key in fmt.rule_keys if key != "file"}
    if "file" in fmt.rule_keys:
        labels["file"] = np.full(len(rows), posixpath.basename(path.rstrip("/")), dtype=object)
    hash_ids = None
    if fmt.prefix_blocks:
        blocks = [b for part in found.get("hash_ids", []) for b in part]
        hash_ids = [blocks[int(i)] for i in where]
    return Contents(
        prompt_tokens=column("prompt_tokens").astype(np.int64),
        output_tokens=column("output_tokens").astype(np.int64),
        labels=labels,
        hash_ids=hash_ids,
    )


@dataclass
class _Lengths:
    """Running figures of the kept rows' recorded lengths."""

    max_prompt: int = 0
    max_output: int = 0
    sum_prompt: float = 0.0
    sum_output: float = 0.0

    def add(self, prompts: np.ndarray, outputs: np.ndarray) -> None:
        if len(prompts):
            self.max_prompt = max(self.max_prompt, int(prompts.max()))
            self.max_output = max(self.max_output, int(outputs.max()))
            self.sum_prompt += float(prompts.sum(dtype=np.float64))
            self.sum_output += float(outputs.sum(dtype=np.float64))


@dataclass(frozen=True)
class _Pass:
    ns: np.ndarray  # absolute
    rows: np.ndarray
    failed: np.ndarray
    earliest: int  # the file's first arrival, failed requests included
    lengths: _Lengths


def _stream_arrivals(
    paths: Sequence[str], fmt: StreamedFormat, start_s: float, duration_s: float | None, keep_failed: bool
) -> Arrivals:
    # First assume the files are in time order (the public traces are): the trace starts at the earliest first row,
    # the window is cut as the rows go by, and each file is read up to the window's end. A row out of order means
    # the trace's start is only known at the end: then every file is read whole and the window cut after.
    origin = min(_first_arrival(path, fmt) for path in paths)
    ordered = [_window_pass(path, fmt, start_s, duration_s, keep_failed, origin=origin) for path in paths]
    parts = [p for p in ordered if p is not None]
    whole = len(parts) < len(paths)
    if whole:
        parts = [_whole_pass(path, fmt, keep_failed) for path in paths]
        origin = min(p.earliest for p in parts)
    ns = np.concatenate([p.ns for p in parts]) - origin
    rows = np.concatenate([p.rows for p in parts])
    failed = np.concatenate([p.failed for p in parts])
    files = np.concatenate([np.full(len(p.ns), i, np.int64) for i, p in enumerate(parts)])
    order = np.argsort(ns, kind="stable")  # files merged by time (ties: in the order the paths are named)
    if whole:
        order = order[in_window(ns[order], start_s, duration_s)]
    if not len(order):
        raise TraceError(f"{', '.join(paths)}: no arrivals in the window {window(start_s, duration_s)}")
    # A trace read whole (out of order) counts rows outside the window too: an upper bound, as sizing needs.
    n = sum(len(p.ns) for p in parts)
    return Arrivals(
        ns[order], rows[order], failed[order], files[order], True,
        max_prompt_tokens=max(p.lengths.max_prompt for p in parts),
        max_output_tokens=max(p.lengths.max_output for p in parts),
        mean_prompt_tokens=sum(p.lengths.sum_prompt for p in parts) / max(n, 1),
        mean_output_tokens=sum(p.lengths.sum_output for p in parts) / max(n, 1),
    )  # fmt: skip


def _first_arrival(path: str, fmt: StreamedFormat) -> int:
    batches = fmt.batches(path)
    try:
        for _, batch in batches:
            ns, _ = arrival_columns(path, fmt, batch)
            if len(ns):
                return int(ns[0])
    finally:
        batches.close()
    raise TraceError(f"{path}: no arrivals")


def _whole_pass(path: str, fmt: StreamedFormat, keep_failed: bool) -> _Pass:
    found = _window_pass(path, fmt, 0.0, None, keep_failed, origin=None)
    assert found is not None  # only a pass in time order gives up
    return found


def _window_pass(
    path: str, fmt: StreamedFormat, start_s: float, duration_s: float | None, keep_failed: bool, *,
    origin: int | None,
) -> _Pass | None:  # fmt: skip
    """One pass over a file. With `origin`, rows are kept inside the window from it, the pass stops at the window's
    end, and it gives up (None) at a row out of order; without, every row is kept."""
    start_ns = round(start_s * NS)
    end_ns = None if duration_s is None else round((start_s + duration_s) * NS)
    times: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    failed: list[np.ndarray] = []
    earliest = 2**63 - 1
    previous = -(2**63)
    lengths = _Lengths()
    kept = 0
    most = limits.current().replay_rows
    for first, batch in fmt.batches(path):
        ns, fail = arrival_columns(path, fmt, batch)
        if not len(ns):
            continue
        if origin is not None and (ns[0] < previous or np.any(np.diff(ns) < 0)):
            return None
        previous = max(previous, int(ns.max()))
        earliest = min(earliest, int(ns.min()))
        keep = np.ones(len(ns), bool) if keep_failed else ~fail
        if origin is not None:
            keep &= ns - origin >= start_ns
            if end_ns is not None:
                keep &= ns - origin < end_ns
        if keep.any():
            # The replayed rows' lengths are checked now, when the campaign is validated, not in a worker.
            checked = contents_columns(path, fmt, batch.filter(pa.array(keep)))
            lengths.add(checked["prompt_tokens"], checked["output_tokens"])
            kept += int(keep.sum())
            if kept > most:  # before the kept arrays outgrow memory, not after
                raise TraceError(
                    f"{path}: more than {limits.figure(most)} rows in the replay window (limit replay_rows): cut "
                    f"it with start_s / duration_s, or raise it with {limits.raise_hint('replay_rows', most * 10)}"
                )
        times.append(ns[keep])
        rows.append(np.flatnonzero(keep) + first)
        failed.append(fail[keep])
        if origin is not None and end_ns is not None and previous - origin >= end_ns:
            break  # a file in time order has nothing more for the window
    if not times:
        raise TraceError(f"{path}: no arrivals")
    return _Pass(np.concatenate(times), np.concatenate(rows), np.concatenate(failed), earliest, lengths)


def numbered(reader: Any) -> Iterator[tuple[int, pa.RecordBatch]]:
    first = 0
    for batch in reader:
        yield first, batch
        first += batch.num_rows


def arrival_columns(path: str, fmt: StreamedFormat, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """(arrival ns, failed) of a batch; a bad value sends the reader back to name its line."""
    try:
        return fmt.arrival_columns(batch)
    except (pa.ArrowInvalid, ValueError) as exc:
        raise locate(path, fmt, str(exc)) from None


def contents_columns(path: str, fmt: StreamedFormat, batch: pa.RecordBatch) -> dict[str, Any]:
    try:
        prompts, outputs, out = fmt.length_columns(batch)
        if np.any(prompts < 0) or np.any(outputs < 0):
            raise ValueError("negative")
    except (pa.ArrowInvalid, ValueError) as exc:
        raise locate(path, fmt, str(exc)) from None
    out["prompt_tokens"] = prompts
    out["output_tokens"] = outputs
    return out


def numbers(column: pa.Array | pa.ChunkedArray, to: pa.DataType) -> np.ndarray:
    if column.null_count:
        raise ValueError("missing value")
    values = pc.cast(column, to) if column.type != to else column
    array = np.asarray(values.to_numpy(zero_copy_only=False))
    if to == pa.float64() and not np.all(np.isfinite(array)):
        raise ValueError("not finite")
    return array


def locate(path: str, fmt: StreamedFormat, arrow_message: str) -> TraceError:
    """The first bad row as `file:line: field: what is wrong` (the Arrow message when the rescan finds none)."""
    lines = bounded_lines(path)
    try:
        found = fmt.first_bad_row(lines, path)
    finally:
        lines.close()
    if found is not None:
        return TraceError(f"{path}:{found}")
    return TraceError(f"{path}: not a readable {fmt.name} trace: {arrow_message.splitlines()[0]}")
