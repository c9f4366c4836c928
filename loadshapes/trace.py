"""The trace: one Parquet row per scheduled request, errors included. This module is the schema's one home.

Files are Hive-partitioned by arm and shape (`ROOT/arm=.../shape=.../part-*.parquet`), written atomically
(a temporary name, then a rename), to a local path or any pyarrow filesystem URI. Read them back with
`read_traces(root)`, or point DuckDB / Polars / pandas at ROOT with Hive partitioning.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Generator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from loadshapes.badfile import BadFileError, parquet_metadata

SCHEMA_VERSION = "2"
VERSION_KEY = b"specdrill.trace_schema_version"
PARTITION_COLUMNS = ("arm", "shape")

_FIELDS: list[pa.Field] = [
    pa.field("campaign", pa.string(), nullable=False),
    pa.field("run", pa.string(), nullable=False),
    pa.field("arm", pa.string(), nullable=False),
    pa.field("policy", pa.string()),
    pa.field("topology", pa.string()),
    pa.field("shape", pa.string(), nullable=False),
    pa.field("phase", pa.string()),
    pa.field("worker", pa.int32()),
    pa.field("request_id", pa.string(), nullable=False),
    # Planning-time keys (version 2): request i of (shape, repeat) pairs across arms on (shape, repeat,
    # request_index), and its place on the unit's clock, without the analysis parsing ids or rebuilding shapes.
    pa.field("repeat", pa.int32(), nullable=False),
    pa.field("request_index", pa.int64(), nullable=False),
    pa.field("category", pa.string()),
    pa.field("prompt_sha256", pa.string()),
    pa.field("prompt", pa.string()),
    # Multi-turn sessions (a data set entry's `sessions`), added within version 2: null for a single-turn request
    # and in traces written before.
    pa.field("session_id", pa.int64()),  # the request_index of the session's first turn (its arrival)
    pa.field("turn", pa.int32()),  # this request's turn in its session, 1 for the first
    # Client times: epoch nanoseconds on specdrill's monotonic-anchored clock.
    pa.field("scheduled_ns", pa.int64(), nullable=False),
    pa.field("unit_start_ns", pa.int64()),  # the unit's common start (every worker's go time)
    pa.field("offset_s", pa.float64()),  # scheduled time, seconds after the unit's start
    pa.field("offered_rate_rps", pa.float64()),  # the shape's rate at offset_s; null for closed loop
    pa.field("sent_ns", pa.int64()),  # the request's bytes went to the socket (after any wait for a connection)
    pa.field("first_token_ns", pa.int64()),
    pa.field("done_ns", pa.int64()),  # when the outcome was known: the last byte, or the failure / cancellation
    pa.field("send_lateness_ns", pa.int64()),  # dispatched to the HTTP client minus scheduled: the worker's own
    pa.field("prompt_tokens", pa.int32()),
    pa.field("output_tokens", pa.int32()),
    # Latencies count from the SCHEDULED time (no coordinated omission).
    pa.field("ttft_s", pa.float64()),
    pa.field("e2e_s", pa.float64()),
    pa.field("tpot_s", pa.float64()),
    pa.field("itl_p50_s", pa.float64()),
    pa.field("itl_p99_s", pa.float64()),
    pa.field("itl_max_s", pa.float64()),
    pa.field("token_times_ns", pa.list_(pa.int64())),
    # Server telemetry (the response's `specdrill` object and metrics.speculative_decoding).
    pa.field("queue_wait_s", pa.float64()),
    pa.field("server_received_ns", pa.int64()),
    pa.field("server_first_scheduled_ns", pa.int64()),
    pa.field("server_first_token_ns", pa.int64()),
    pa.field("server_done_ns", pa.int64()),
    # Per-request summaries of the engine steps the request was in (version 2), always written. The per-step
    # lists below are optional (load.store_step_lists): the engine step timeline holds every step once, while
    # the lists repeat each step for every request in its batch.
    pa.field("engine_steps", pa.int32()),
    pa.field("step_batch_mean", pa.float64()),
    pa.field("step_batch_max", pa.int32()),
    pa.field("step_k_sum", pa.int64()),
    pa.field("spec_steps", pa.int32()),  # steps that verified drafts
    pa.field("drafted_tokens", pa.int64()),
    pa.field("accepted_tokens", pa.int64()),
    pa.field("step_batch_size", pa.list_(pa.int32())),
    pa.field("step_k", pa.list_(pa.int16())),
    pa.field("per_step_drafted", pa.list_(pa.int16())),
    pa.field("per_step_accepted", pa.list_(pa.int16())),
    pa.field("mean_acceptance_length", pa.float64()),
    pa.field("resolved_speculative_config", pa.string()),  # JSON, as the engine reported it
    pa.field("schedule_dropped", pa.bool_()),
    pa.field("replica_id", pa.string()),
    pa.field("engine_id", pa.string()),
    pa.field("node_id", pa.string()),
    pa.field("status", pa.string(), nullable=False),  # ok | error | timeout | cancelled
    pa.field("error_class", pa.string()),
    pa.field("error_message", pa.string()),
]
TRACE_SCHEMA = pa.schema(_FIELDS, metadata={VERSION_KEY: SCHEMA_VERSION.encode()})
# Columns added after version 2's first traces: a file may lack them, and readers give it nulls there (read_traces
# reads with the whole schema; the analysis's SQL selects only columns every version-2 file has).
ADDED_COLUMNS = ("session_id", "turn")
STEP_LIST_COLUMNS = ("step_batch_size", "step_k", "per_step_drafted", "per_step_accepted")
FILE_SCHEMA = pa.schema(
    [f for f in _FIELDS if f.name not in PARTITION_COLUMNS], metadata=TRACE_SCHEMA.metadata
)  # partition values live in the path, as Hive partitioning expects
COLUMNS = tuple(f.name for f in _FIELDS)
# Rows per pa.array call (a 256-value scalar column takes ~30 us here; list columns go in smaller slices).
_SLICE = 256
_LIST_SLICE = 32


def to_ns(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1e9)


def step_summaries(
    batch: Sequence[int] | None,
    k: Sequence[int] | None,
    drafted: Sequence[int] | None,
    accepted: Sequence[int] | None,
) -> dict[str, Any]:
    """The version-2 summary columns of one request's per-step telemetry (all None when it reported no steps)."""
    steps = len(batch) if batch else 0
    verified = sum(1 for d in drafted if d > 0) if drafted else 0
    return {
        "engine_steps": steps if batch is not None else None,
        "step_batch_mean": sum(batch) / steps if batch else None,
        "step_batch_max": max(batch) if batch else None,
        "step_k_sum": sum(k) if k is not None else None,
        "spec_steps": verified if batch is not None or drafted is not None else None,
        "drafted_tokens": sum(drafted) if drafted is not None else (0 if batch is not None else None),
        "accepted_tokens": sum(accepted) if accepted is not None else (0 if batch is not None else None),
    }


def filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    if "://" in root:
        fs, path = pafs.FileSystem.from_uri(root)
        return fs, str(path)
    return pafs.LocalFileSystem(), root


PART_FILE = "part-"  # part files are named part-<writer id>-<part number>-<random>.parquet


def writer_id(arm: str, shape: str, repeat: int, worker: int | str = "") -> str:
    """The writer id of a unit's load worker; without `worker`, the prefix every worker of the unit shares (what
    a rerun of the unit looks for to remove a partial unit's files)."""
    return f"{arm}-{shape}-r{repeat}-w{worker}"


class PartWriter:
    """Writes rows as part files, one per (arm, shape) group; no buffering and no locks, so a caller may run it
    on a worker thread (the load worker does, off its event loop)."""

    def __init__(self, root: str, *, writer_id: str) -> None:
        self.fs, self.base = filesystem(root)
        self.root = root
        self.writer_id = writer_id
        self.parts = 0
        self.rows_written = 0
        self.files: list[str] = []

    def write(self, rows: Sequence[Mapping[str, Any]]) -> None:
        groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for row in rows:
            groups.setdefault((str(row["arm"]), str(row["shape"])), []).append(row)
        for (arm, shape), group in groups.items():
            self._write_part(arm, shape, group)

    def _write_part(self, arm: str, shape: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self.write_table(arm, shape, rows_to_table(rows))

    def write_table(self, arm: str, shape: str, table: pa.Table) -> None:
        """One part file (atomic: a temporary name, then a rename) from a table already in FILE_SCHEMA."""
        directory = f"{self.base}/arm={quote(arm, safe='')}/shape={quote(shape, safe='')}"
        self.fs.create_dir(directory, recursive=True)
        self.parts += 1
        name = f"{PART_FILE}{self.writer_id}-{self.parts:06d}-{uuid.uuid4().hex[:8]}.parquet"
        temporary = f"{directory}/.tmp-{name}"
        with self.fs.open_output_stream(temporary) as sink:
            pq.write_table(table, sink, compression="zstd")
        self.fs.move(temporary, f"{directory}/{name}")
        self.rows_written += table.num_rows
        self.files.append(f"{directory}/{name}")


def rows_to_table_in_steps(rows: Sequence[Mapping[str, Any]]) -> Generator[str, None, pa.Table]:
    """Row dicts to a FILE_SCHEMA table, column by column in slices, pausing after each slice; each pause says
    what the next step is: another "slice", or "assemble" (the columns into the table, a longer step).

    Each pa.array call holds the GIL for tens of microseconds at most, and the caller decides when the next one
    runs: the load worker steps it only where no send is due. A typed conversion per column also costs a
    fraction of a row-wise RecordBatch.from_pylist (~6 vs ~45 ms per 1000 rows).
    """
    columns = []
    for field in FILE_SCHEMA:
        name, step = field.name, _LIST_SLICE if pa.types.is_list(field.type) else _SLICE
        chunks = []
        for i in range(0, len(rows), step):
            chunks.append(pa.array([row.get(name) for row in rows[i : i + step]], type=field.type))
            yield "slice"
        columns.append(pa.chunked_array(chunks, type=field.type))
    yield "assemble"
    return pa.Table.from_arrays(columns, schema=FILE_SCHEMA)


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    steps = rows_to_table_in_steps(rows)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            table: pa.Table = done.value
            return table


def check_row(row: Mapping[str, Any]) -> None:
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"trace row has columns the schema does not: {', '.join(sorted(unknown))}")


class TraceWriter:
    """Buffers rows and writes part files per (arm, shape); flushes every `flush_rows` rows or `flush_s` seconds.

    Thread-safe; `close()` flushes what is left. Every appended row reaches a file: nothing measured is dropped.
    """

    def __init__(self, root: str, *, writer_id: str, flush_rows: int = 1000, flush_s: float = 5.0) -> None:
        self.parts = PartWriter(root, writer_id=writer_id)
        self.root = root
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self._rows: list[Mapping[str, Any]] = []
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._last_flush = time.monotonic()

    @property
    def rows_written(self) -> int:
        return self.parts.rows_written

    @property
    def files(self) -> list[str]:
        return self.parts.files

    def append(self, row: Mapping[str, Any]) -> None:
        check_row(row)
        with self._lock:
            self._rows.append(row)
            due = len(self._rows) >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_s
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            rows, self._rows = self._rows, []
            self._last_flush = time.monotonic()
        if rows:
            with self._write_lock:
                self.parts.write(rows)

    def close(self) -> None:
        self.flush()


class TraceVersionError(BadFileError):
    """A trace written with another schema version than this specdrill reads."""


def _first_part(fs: pafs.FileSystem, base: str) -> str | None:
    if fs.get_file_info(base).type == pafs.FileType.File:
        return base  # one part file given on its own
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return None
    for info in sorted(infos, key=lambda i: i.path):
        name = info.base_name
        if info.type == pafs.FileType.File and name.endswith(".parquet") and not name.startswith("."):
            return str(info.path)
    return None


def check_trace_version(root: str) -> None:
    """One line, not a confusing column error later: every part file of a trace has the same writer, so the
    first one found speaks for all. Version 1 lacks the planning keys and the step summaries, which only the
    campaign's plans (and the full step lists) could rebuild: rerun the campaign (`specdrill run` or
    `specdrill simulate` into a new output) to get a version-2 trace."""
    fs, base = filesystem(root)
    part = _first_part(fs, base)
    if part is None:
        return
    metadata = parquet_metadata(fs, part, "a trace part file").schema.to_arrow_schema().metadata or {}
    found = metadata.get(VERSION_KEY, b"").decode(errors="replace") or "unknown"
    if found != SCHEMA_VERSION:
        raise TraceVersionError(
            root,
            f"trace schema version {found}, this specdrill reads version {SCHEMA_VERSION} "
            "(planning keys and step summaries per row): rerun the campaign into a new output to report on it",
        )


def read_traces(root: str, *, columns: Sequence[str] | None = None, where: ds.Expression | None = None) -> pa.Table:
    check_trace_version(root)
    fs, base = filesystem(root)
    dataset = ds.dataset(
        base,
        schema=TRACE_SCHEMA,  # a file without ADDED_COLUMNS reads them as nulls
        filesystem=fs,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([TRACE_SCHEMA.field(c) for c in PARTITION_COLUMNS]), flavor="hive"),
        exclude_invalid_files=True,
        ignore_prefixes=[".tmp-", "."],
    )
    table = dataset.to_table(columns=list(columns) if columns else None, filter=where)
    return table.replace_schema_metadata(TRACE_SCHEMA.metadata)


def schema_version(path: str) -> str:
    metadata = pq.read_schema(path).metadata or {}
    return str(metadata.get(VERSION_KEY, b"").decode())


def dumps_config(config: Any) -> str | None:
    return None if config is None else json.dumps(config, sort_keys=True)
