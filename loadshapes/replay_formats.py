"""Readers for the traces `replay` plays back: arrival times, and per-request lengths where the trace has them.

Formats (docs/traffic.md, docs/replay.md):
  - azure: Azure LLM inference traces 2023 / 2024, CSV `TIMESTAMP, ContextTokens, GeneratedTokens`, date-times;
  - burstgpt: BurstGPT, CSV `Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type`, seconds
    from the trace's start; 0 response tokens is a failed request;
  - mooncake: Mooncake JSONL `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (prefix blocks);
  - specdrill: a specdrill trace (a part file or a trace directory), its `scheduled_ns`;
  - csv: timestamps in seconds, one per line or a named column.

Reading is in two passes so that a worker never holds a whole multi-million-row file: `read_arrivals` streams the
file and keeps the arrival times of the rows inside the window (every worker needs them all: request i is the
i-th arrival of the window), checking those rows' lengths without keeping them; `read_contents` streams it again
and keeps the lengths of the rows the caller asks for (a worker's share). Both stop at the end of the window when
the file is in time order, as the public traces are. pyarrow's streaming CSV and JSON readers do the parsing (in
C++, a block at a time); a batch that fails to convert or check sends the reader through the file again line by
line with the csv / json modules, only to name the line and field of the first bad row in one line.
"""

from __future__ import annotations

import array
import csv
import io
import itertools
import json
import math
import posixpath
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.json as pajson

from loadshapes import limits
from loadshapes.trace import PARTITION_COLUMNS, filesystem, read_traces

Format = Literal["azure", "burstgpt", "mooncake", "specdrill", "csv"]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
# What a category rule can look at, per format (`file` is the file's name, for Azure's code and conversation files).
RULE_KEYS: dict[Format, tuple[str, ...]] = {
    "azure": ("file",),
    "burstgpt": ("file", "model", "log_type"),
    "mooncake": ("file",),
    "specdrill": (),
    "csv": (),
}
# pyarrow's read block. A streaming reader's pool peaked near 40x its block here (a 4 MiB block: 160 MiB, 256 KiB:
# 10 MiB) on a 5M-row BurstGPT file, with no gain in speed; JSON lines (Mooncake's hash_ids) must fit in one block.
CSV_BLOCK_BYTES = 256 << 10
_JSON_BLOCK_BYTES = 1 << 20
_NS = 1_000_000_000


class TraceError(ValueError):
    """A trace that cannot be replayed; the message is one line naming the file (and line and field)."""


@dataclass(frozen=True)
class Arrivals:
    """The window's arrivals in time order: nanoseconds from the trace's first arrival, and file row numbers."""

    ns: np.ndarray  # int64
    rows: np.ndarray  # int64: 0-based data rows (header and blank lines not counted); what read_contents takes
    failed: np.ndarray  # bool: recorded as failed (BurstGPT's 0 response tokens); all False elsewhere
    files: np.ndarray  # int64: which of the paths each arrival is from
    has_lengths: bool
    # The window's recorded lengths (traces with lengths), for sizing the plan before it is built.
    max_prompt_tokens: int = 0
    max_output_tokens: int = 0
    mean_prompt_tokens: float = 0.0
    mean_output_tokens: float = 0.0


@dataclass(frozen=True)
class Contents:
    """Recorded lengths of the rows asked for, in the order asked."""

    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    labels: dict[str, np.ndarray]  # rule key -> value per row (object arrays of str)
    hash_ids: list[np.ndarray] | None  # Mooncake's prefix blocks per row


def detect_format(path: str) -> Format:
    """The format from the path and the first line: a directory or Parquet is a trace, `{` starts Mooncake JSONL,
    a header naming Azure's or BurstGPT's columns is that, anything else is a timestamp CSV."""
    fs, base = filesystem(path)
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.NotFound:
        raise TraceError(f"{path}: no such file or directory")
    if info.type == pafs.FileType.Directory or posixpath.splitext(path.rstrip("/"))[1].lower() == ".parquet":
        return "specdrill"
    with fs.open_input_stream(base) as stream:
        head = stream.read(64 << 10)
    if head.startswith(b"PAR1"):
        return "specdrill"
    text = head.decode("utf-8-sig", errors="replace").lstrip()
    if text.startswith("{"):
        return "mooncake"
    try:
        first = next(csv.reader(io.StringIO(text.split("\n", 1)[0])), [])
    except csv.Error as exc:  # a lone carriage return, a NUL: random bytes, not a trace of any format
        raise TraceError(
            f"{path}: not a replay file (CSV, JSONL or Parquet): its first line is not CSV ({exc})"
        ) from None
    names = {c.strip() for c in first}
    if set(AZURE_COLUMNS) <= names:
        return "azure"
    if set(BURSTGPT_COLUMNS) <= names:
        return "burstgpt"
    return "csv"


def read_arrivals(
    paths: Sequence[str],
    fmt: Format,
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    keep_failed: bool = False,
    column: str | None = None,
    arm: str | None = None,
    shape: str | None = None,
) -> Arrivals:
    """The arrivals inside [start_s, start_s + duration_s) of the trace's own seconds from its first arrival.

    Several files of one format (Azure's code and conversation traces) are one trace, merged by time."""
    if fmt in ("csv", "specdrill"):
        path = paths[0]
        if len(paths) != 1:
            raise TraceError(f"{', '.join(paths)}: a {fmt} trace is one file or trace directory")
        if fmt == "csv" and (arm is not None or shape is not None):
            raise TraceError(f"{path}: arm and shape pick from a trace, not a CSV")
        if fmt == "specdrill" and column is not None:
            raise TraceError(f"{path}: column names a CSV column; a trace replays scheduled_ns")
        ns = csv_ns(path, column) if fmt == "csv" else _trace_ns(path, arm, shape)
        order = np.argsort(ns, kind="stable")
        ns = ns[order] - ns[order[0]]
        inside = _in_window(ns, start_s, duration_s)
        if not inside.any():
            raise TraceError(f"{path}: no arrivals in the window {_window(start_s, duration_s)}")
        n = int(inside.sum())
        return Arrivals(ns[inside], order[inside], np.zeros(n, bool), np.zeros(n, np.int64), False)
    if column is not None or arm is not None or shape is not None:
        raise TraceError(f"{paths[0]}: column, arm and shape apply to csv and specdrill traces, not {fmt}")
    return _stream_arrivals(paths, fmt, start_s, duration_s, keep_failed)


def read_contents(paths: Sequence[str], fmt: Format, files: np.ndarray, rows: np.ndarray) -> Contents:
    """The recorded lengths (and rule keys, prefix blocks) of rows `rows` of files `files` (indices into paths)."""
    files = np.asarray(files, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    prompts = np.zeros(len(rows), np.int64)
    outputs = np.zeros(len(rows), np.int64)
    labels = {key: np.empty(len(rows), dtype=object) for key in RULE_KEYS[fmt]}
    hash_ids: list[np.ndarray] | None = [np.zeros(0, np.int64)] * len(rows) if fmt == "mooncake" else None
    for f in np.unique(files):
        at = np.flatnonzero(files == f)
        part = _contents_of(paths[int(f)], fmt, rows[at])
        prompts[at] = part.prompt_tokens
        outputs[at] = part.output_tokens
        for key, values in part.labels.items():
            labels[key][at] = values
        if hash_ids is not None and part.hash_ids is not None:
            for position, ids in zip(at, part.hash_ids, strict=True):
                hash_ids[int(position)] = ids
    return Contents(prompt_tokens=prompts, output_tokens=outputs, labels=labels, hash_ids=hash_ids)


def _contents_of(path: str, fmt: Format, rows: np.ndarray) -> Contents:
    """read_contents of one file: one pass, stopped at the last row asked for."""
    wanted = np.unique(rows)
    found: dict[str, list[Any]] = {}
    if len(wanted):
        for first, batch in _batches(path, fmt):
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

    labels = {key: column(key) for key in RULE_KEYS[fmt] if key != "file"}
    if "file" in RULE_KEYS[fmt]:
        labels["file"] = np.full(len(rows), posixpath.basename(path.rstrip("/")), dtype=object)
    hash_ids = None
    if fmt == "mooncake":
        blocks = [b for part in found.get("hash_ids", []) for b in part]
        hash_ids = [blocks[int(i)] for i in where]
    return Contents(
        prompt_tokens=column("prompt_tokens").astype(np.int64),
        output_tokens=column("output_tokens").astype(np.int64),
        labels=labels,
        hash_ids=hash_ids,
    )


def _window(start_s: float, duration_s: float | None) -> str:
    return f"[{start_s:g}, {'end' if duration_s is None else f'{start_s + duration_s:g}'}) s"


def _in_window(ns: np.ndarray, start_s: float, duration_s: float | None) -> np.ndarray:
    inside: np.ndarray = ns >= round(start_s * _NS)
    if duration_s is not None:
        inside &= ns < round((start_s + duration_s) * _NS)
    return inside


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
    paths: Sequence[str], fmt: Format, start_s: float, duration_s: float | None, keep_failed: bool
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
        order = order[_in_window(ns[order], start_s, duration_s)]
    if not len(order):
        raise TraceError(f"{', '.join(paths)}: no arrivals in the window {_window(start_s, duration_s)}")
    # A trace read whole (out of order) counts rows outside the window too: an upper bound, as sizing needs.
    n = sum(len(p.ns) for p in parts)
    return Arrivals(
        ns[order], rows[order], failed[order], files[order], True,
        max_prompt_tokens=max(p.lengths.max_prompt for p in parts),
        max_output_tokens=max(p.lengths.max_output for p in parts),
        mean_prompt_tokens=sum(p.lengths.sum_prompt for p in parts) / max(n, 1),
        mean_output_tokens=sum(p.lengths.sum_output for p in parts) / max(n, 1),
    )  # fmt: skip


def _first_arrival(path: str, fmt: Format) -> int:
    batches = _batches(path, fmt)
    try:
        for _, batch in batches:
            ns, _ = _arrival_columns(path, fmt, batch)
            if len(ns):
                return int(ns[0])
    finally:
        batches.close()
    raise TraceError(f"{path}: no arrivals")


def _whole_pass(path: str, fmt: Format, keep_failed: bool) -> _Pass:
    found = _window_pass(path, fmt, 0.0, None, keep_failed, origin=None)
    assert found is not None  # only a pass in time order gives up
    return found


def _window_pass(
    path: str, fmt: Format, start_s: float, duration_s: float | None, keep_failed: bool, *, origin: int | None
) -> _Pass | None:
    """One pass over a file. With `origin`, rows are kept inside the window from it, the pass stops at the window's
    end, and it gives up (None) at a row out of order; without, every row is kept."""
    start_ns = round(start_s * _NS)
    end_ns = None if duration_s is None else round((start_s + duration_s) * _NS)
    times: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    failed: list[np.ndarray] = []
    earliest = 2**63 - 1
    previous = -(2**63)
    lengths = _Lengths()
    kept = 0
    most = limits.current().replay_rows
    for first, batch in _batches(path, fmt):
        ns, fail = _arrival_columns(path, fmt, batch)
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


def _batches(path: str, fmt: Format) -> Generator[tuple[int, pa.RecordBatch], None, None]:
    """(first data row, batch) of the columns replay uses. CSV cells are read as strings so that a bad cell is
    found by the checks here, not lost inside a conversion error that does not say its row."""
    fs, base = filesystem(path)
    if fmt == "mooncake":
        schema = pa.schema([
            ("timestamp", pa.float64()), ("input_length", pa.int64()), ("output_length", pa.int64()),
            ("hash_ids", pa.list_(pa.int64())),
        ])  # fmt: skip
        options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        with fs.open_input_stream(base) as stream:
            try:
                block = max(_JSON_BLOCK_BYTES, limits.current().line_bytes + 1)  # a line fits in one block
                reader = pajson.open_json(stream, read_options=pajson.ReadOptions(block_size=block),
                                          parse_options=options)  # fmt: skip
                yield from _numbered(reader)
            except pa.ArrowInvalid as exc:
                raise _locate(path, fmt, str(exc)) from None
        return
    need = AZURE_COLUMNS if fmt == "azure" else tuple(c for c in BURSTGPT_COLUMNS if c != "Total tokens")
    with fs.open_input_stream(base) as stream:
        try:
            reader = pacsv.open_csv(
                stream,
                read_options=pacsv.ReadOptions(block_size=max(CSV_BLOCK_BYTES, limits.current().line_bytes + 1)),
                convert_options=pacsv.ConvertOptions(
                    include_columns=list(need), column_types=dict.fromkeys(need, pa.string())
                ),
            )
            yield from _numbered(reader)
        except (pa.ArrowInvalid, KeyError) as exc:
            raise _locate(path, fmt, str(exc)) from None


def _numbered(reader: Any) -> Iterator[tuple[int, pa.RecordBatch]]:
    first = 0
    for batch in reader:
        yield first, batch
        first += batch.num_rows


def _arrival_columns(path: str, fmt: Format, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """(arrival ns, failed) of a batch; a bad value sends the reader back to name its line."""
    try:
        if fmt == "azure":
            ns = _datetime_ns(batch.column("TIMESTAMP"))
            return ns, np.zeros(len(ns), bool)
        if fmt == "burstgpt":
            seconds = _numbers(batch.column("Timestamp"), pa.float64())
            responses = _numbers(batch.column("Response tokens"), pa.int64())
            if np.any(responses < 0):
                raise ValueError("negative")
            return _seconds_ns(seconds), responses == 0
        ms = _numbers(batch.column("timestamp"), pa.float64())
        return _seconds_ns(ms / 1000.0), np.zeros(len(ms), bool)
    except (pa.ArrowInvalid, ValueError) as exc:
        raise _locate(path, fmt, str(exc)) from None


def contents_columns(path: str, fmt: Format, batch: pa.RecordBatch) -> dict[str, Any]:
    try:
        if fmt == "azure":
            prompts = _numbers(batch.column("ContextTokens"), pa.int64())
            outputs = _numbers(batch.column("GeneratedTokens"), pa.int64())
            out: dict[str, Any] = {}
        elif fmt == "burstgpt":
            prompts = _numbers(batch.column("Request tokens"), pa.int64())
            outputs = _numbers(batch.column("Response tokens"), pa.int64())
            out = {
                "model": np.asarray(batch.column("Model").to_pylist(), dtype=object),
                "log_type": np.asarray(batch.column("Log Type").to_pylist(), dtype=object),
            }
        else:
            prompts = _numbers(batch.column("input_length"), pa.int64())
            outputs = _numbers(batch.column("output_length"), pa.int64())
            hashes = batch.column("hash_ids")
            if hashes.null_count:
                raise ValueError("missing hash_ids")
            flat = hashes.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
            if np.any(flat < 0):
                raise ValueError("negative hash id")
            cuts = hashes.offsets.to_numpy()
            out = {"hash_ids": [flat[a:b] for a, b in itertools.pairwise(cuts)]}
        if np.any(prompts < 0) or np.any(outputs < 0):
            raise ValueError("negative")
    except (pa.ArrowInvalid, ValueError) as exc:
        raise _locate(path, fmt, str(exc)) from None
    out["prompt_tokens"] = prompts
    out["output_tokens"] = outputs
    return out


def _numbers(column: pa.Array | pa.ChunkedArray, to: pa.DataType) -> np.ndarray:
    if column.null_count:
        raise ValueError("missing value")
    values = pc.cast(column, to) if column.type != to else column
    array = np.asarray(values.to_numpy(zero_copy_only=False))
    if to == pa.float64() and not np.all(np.isfinite(array)):
        raise ValueError("not finite")
    return array


def _seconds_ns(seconds: np.ndarray) -> np.ndarray:
    ns: np.ndarray = np.rint(seconds * _NS).astype(np.int64)
    return ns


def _datetime_ns(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Azure's date-times: 2023's have no zone (`2023-11-16 18:15:46.6805900`), 2024's mostly end in `+00:00`.

    Arrow casts a column either with zones or without; a batch that mixes them is cast in two parts."""
    if column.null_count:
        raise ValueError("missing value")
    zoned = np.asarray(pc.match_substring_regex(column, r"(Z|[+-]\d\d:?\d\d)$").to_numpy(zero_copy_only=False))
    out = np.empty(len(column), dtype=np.int64)
    for mask, kind in ((zoned, pa.timestamp("ns", tz="UTC")), (~zoned, pa.timestamp("ns"))):
        if mask.any():
            part = pc.cast(pc.filter(column, pa.array(mask)), kind).cast(pa.int64())
            out[mask] = np.asarray(part.to_numpy(zero_copy_only=False))
    return out


# ---- naming the bad row: a line-by-line pass, only once a batch has failed ----


def _cell_checks(fmt: Format) -> dict[str, Callable[[str], str | None]]:
    """Per field: what is wrong with a cell (None when it is fine). The same rules as the batch checks above."""

    def count(cell: str) -> str | None:
        try:
            value = int(cell)
        except ValueError:
            return f"{cell!r} is not a whole number of tokens"
        return f"{cell!r} is negative" if value < 0 else None

    def seconds(cell: str) -> str | None:
        try:
            value = float(cell)
        except ValueError:
            return f"{cell!r} is not a number of seconds"
        return None if math.isfinite(value) else f"{cell!r} is not a finite number"

    def stamp(cell: str) -> str | None:
        for kind in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
            try:
                pc.cast(pa.array([cell]), kind)
                return None
            except pa.ArrowInvalid:
                continue
        return f"{cell!r} is not a date-time (YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM])"

    def text(cell: str) -> str | None:
        return None

    if fmt == "azure":
        return {"TIMESTAMP": stamp, "ContextTokens": count, "GeneratedTokens": count}
    return {"Timestamp": seconds, "Model": text, "Request tokens": count, "Response tokens": count, "Log Type": text}


def bounded_lines(path: str) -> Generator[str, None, None]:
    """The file's lines as text, each read with a bound (limits.line_kib): a line over it, or bytes that are not
    UTF-8, end the read in one line naming the file and line, before a longer line is ever held."""
    most = limits.current().line_bytes
    fs, base = filesystem(path)
    with fs.open_input_stream(base) as raw:
        lines = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        number = 0
        while True:
            number += 1
            try:
                line = lines.readline(most + 1)
            except UnicodeDecodeError as exc:
                raise TraceError(f"{path}:{number}: not UTF-8 text ({exc.reason})") from None
            if not line:
                return
            if len(line) > most and not line.endswith(("\n", "\r")):
                raise TraceError(
                    f"{path}:{number}: a line longer than {limits.figure(most)} characters (limit line_kib = "
                    f"{limits.current().line_kib:g}; raise it with {limits.raise_hint('line_kib', 10 * most / 1024)})"
                )
            yield line


def _locate(path: str, fmt: Format, arrow_message: str) -> TraceError:
    """The first bad row as `file:line: field: what is wrong` (the Arrow message when the rescan finds none)."""
    lines = bounded_lines(path)
    try:
        found = _locate_jsonl(lines) if fmt == "mooncake" else _locate_csv(lines, fmt, path)
    finally:
        lines.close()
    if found is not None:
        return TraceError(f"{path}:{found}")
    return TraceError(f"{path}: not a readable {fmt} trace: {arrow_message.splitlines()[0]}")


def _csv_reader(lines: Iterator[str]) -> Any:
    # A field may be as long as a line may be (csv's own bound is 128 KiB, process-wide)
    csv.field_size_limit(max(csv.field_size_limit(), limits.current().line_bytes))
    return csv.reader(lines)


def _locate_csv(lines: Iterator[str], fmt: Format, path: str) -> str | None:
    reader = _csv_reader(lines)
    checks = _cell_checks(fmt)
    header: list[str] | None = None
    for row in _csv_rows(reader, path):
        if not any(c.strip() for c in row):
            continue
        if header is None:
            header = row
            missing = [name for name in checks if name not in header]
            if missing:
                return f"{reader.line_num}: no column {missing[0]!r} in the header ({', '.join(header)})"
            continue
        if len(row) != len(header):
            return f"{reader.line_num}: expected {len(header)} fields, got {len(row)}"
        for name, check in checks.items():
            problem = check(row[header.index(name)].strip())
            if problem is not None:
                return f"{reader.line_num}: {name}: {problem}"
    return None if header is not None else "1: empty, expected a header"


def _locate_jsonl(lines: Iterator[str]) -> str | None:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"{number}: not JSON: {exc.msg}"
        if not isinstance(data, dict):
            return f"{number}: not a JSON object"
        for name in MOONCAKE_FIELDS:
            value = data.get(name)
            if name == "hash_ids":
                if not isinstance(value, list) or not all(type(h) is int and h >= 0 for h in value):
                    return f"{number}: hash_ids: {value!r} is not a list of integers >= 0"
            elif name == "timestamp":
                if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                    return f"{number}: timestamp: {value!r} is not a number of milliseconds"
            elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
                return f"{number}: {name}: {value!r} is not a whole number of tokens >= 0"
    return None


# ---- csv and specdrill traces: arrival times only ----


def _csv_rows(reader: Any, path: str) -> Iterator[list[str]]:
    """The reader's rows, or one line naming the line it could not split (a NUL, a stray carriage return)."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: not a CSV line ({exc})") from None
        yield row


def csv_ns(path: str, column: str | None) -> np.ndarray:
    """Timestamps in seconds (absolute epoch or relative), one per line or in the named column of a header.

    Streamed a bounded line at a time into an array of doubles (8 bytes a row, up to limits.replay_rows)."""
    most = limits.current().replay_rows
    lines = bounded_lines(path)
    reader = _csv_reader(lines)
    need_header, index, width = column is not None, 0, 1
    values = array.array("d")
    for row in _csv_rows(reader, path):
        cells = [c.strip() for c in row]
        if not any(cells):
            continue
        where = f"{path}:{reader.line_num}"
        if need_header:
            if column not in cells:
                raise TraceError(f"{where}: no column {column!r} in the header ({', '.join(cells)})")
            need_header, index, width = False, cells.index(column), len(cells)
            continue
        if len(cells) != width:
            hint = "" if column else "; name the column to read with column"
            raise TraceError(f"{where}: expected {width} fields, got {len(cells)}{hint}")
        try:
            value = float(cells[index])
        except ValueError:
            hint = " (a header? name the column with column)" if column is None and not values else ""
            raise TraceError(f"{where}: {cells[index]!r} is not a number{hint}") from None
        if not math.isfinite(value):
            raise TraceError(f"{where}: {cells[index]!r} is not a finite number")
        if value < 0:
            raise TraceError(f"{where}: {cells[index]!r} is negative")
        if len(values) >= most:
            raise TraceError(f"{where}: more than {limits.figure(most)} arrivals (limit replay_rows; raise it with "
                             f"{limits.raise_hint('replay_rows', most * 10)})")  # fmt: skip
        values.append(value)
    if need_header:
        raise TraceError(f"{path}: empty, expected a header naming {column!r}")
    if not values:
        raise TraceError(f"{path}: no arrivals")
    return _seconds_ns(np.frombuffer(values, dtype=np.float64))


def _trace_ns(path: str, arm: str | None, shape: str | None) -> np.ndarray:
    where = None
    for name, wanted in (("arm", arm), ("shape", shape)):
        if wanted is not None:  # read only the partition asked for
            match = ds.field(name) == wanted
            where = match if where is None else where & match
    try:
        table = read_traces(path, columns=["scheduled_ns", *PARTITION_COLUMNS], where=where)
    except (pa.ArrowException, OSError) as e:
        raise TraceError(f"{path}: not a readable trace: {e}") from None
    most = limits.current().replay_rows
    if table.num_rows > most:
        raise TraceError(
            f"{path}: {limits.figure(table.num_rows)} trace rows, more than {limits.figure(most)} "
            f"(limit replay_rows; raise it with {limits.raise_hint('replay_rows', table.num_rows)})"
        )
    groups = table.group_by(list(PARTITION_COLUMNS)).aggregate([]).to_pylist()
    pairs = sorted(f"{g['arm']}/{g['shape']}" for g in groups)
    if not pairs:
        raise TraceError(f"{path}: no trace rows for arm={arm!r} shape={shape!r}")
    if len(pairs) > 1:
        raise TraceError(f"{path}: {len(pairs)} arm/shape pairs ({', '.join(pairs)}): pick one with arm and shape")
    scheduled = table["scheduled_ns"]
    if scheduled.null_count:
        raise TraceError(f"{path}: {scheduled.null_count} rows without scheduled_ns")
    return np.asarray(scheduled.to_numpy()).astype(np.int64)
