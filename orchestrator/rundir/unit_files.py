"""A unit's files beyond its part files: the engine step timeline (one Parquet file per unit), the merge of a
unit's part files into one, and what is read back from their footers (rows on disk, the unit's TPOT median)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow.fs import FileSelector, FileType

from loadshapes.badfile import (
    make_directory,
    parquet_metadata,
    write_failed,
)
from orchestrator.logs import get_logger
from orchestrator.rundir.layout import (
    TIMELINE_BOOL_COLUMNS,
    TIMELINE_FLOAT_COLUMNS,
    TIMELINE_INT_COLUMNS,
    RunStore,
    Unit,
)

log = get_logger(__name__)


def timeline_table(timelines: dict[str, dict[str, list[Any]]]) -> pa.Table:
    names = ("start", "end", *TIMELINE_INT_COLUMNS, *TIMELINE_FLOAT_COLUMNS, *TIMELINE_BOOL_COLUMNS)
    columns: dict[str, list[Any]] = {name: [] for name in ("engine_id", *names)}
    for engine_id, data in timelines.items():
        n = len(data.get("start", []))
        columns["engine_id"].extend([engine_id] * n)
        for name in names:
            default = 0 if name == "dp_rank" else None  # an engine without ranks is rank 0
            values = data.get(name)
            columns[name].extend(values if values is not None else [default] * n)
    floats = {
        name: pa.array(columns[name], pa.float64())
        for name in TIMELINE_FLOAT_COLUMNS
        if any(name in data for data in timelines.values())
    }
    # An engine that cannot skip drafts beside one that can (a mixed arm never happens; a merge might): not skipped.
    bools = {
        name: pa.array([bool(v) for v in columns[name]], pa.bool_())
        for name in TIMELINE_BOOL_COLUMNS
        if any(name in data for data in timelines.values())
    }
    return pa.table(
        {
            "engine_id": pa.array(columns["engine_id"], pa.string()),
            "start_ns": pa.array([round(t * 1e9) for t in columns["start"]], pa.int64()),
            "end_ns": pa.array([round(t * 1e9) for t in columns["end"]], pa.int64()),
            **{name: pa.array(columns[name], pa.int32()) for name in TIMELINE_INT_COLUMNS},
            **floats,
            **bools,
        }
    )


def write_timeline(store: RunStore, unit: Unit, timelines: dict[str, dict[str, list[Any]]]) -> int:
    table = timeline_table(timelines)
    path = store.timeline_file(unit)
    directory = path.rsplit("/", 1)[0]
    make_directory(store.fs, directory, "timeline directory")
    temporary = f"{directory}/.tmp-r{unit.repeat}.parquet"
    try:
        with store.fs.open_output_stream(temporary) as sink:
            pq.write_table(table, sink, compression="zstd")
        store.fs.move(temporary, path)
    except OSError as exc:
        raise write_failed(path, exc) from None
    return int(table.num_rows)


MERGED_WORKER = "merged"  # the worker slot in a merged file's name: part-<arm>-<shape>-r<repeat>-wmerged-...
MERGED_ROW_GROUP = 100_000  # rows per row group of a merged file (a worker's part file holds ~1000)


def merge_parts(store: RunStore, unit: Unit) -> str | None:
    """A completed unit's part files as one file with large row groups; the merged file's path, or None where
    there was nothing to merge (one part file or none) or the parts could not be merged (left as they are).

    Workers write a part file every thousand rows so a crash loses little; afterwards that layout costs every
    reader (the report, DuckDB or Polars on the traces) a file open and a footer per thousand rows, ten thousand
    for ten million rows. The merged file is written beside the parts under a temporary name, renamed into place
    under the unit's writer prefix, checked for every row, and only then are the parts deleted. The unit's
    marker comes after: a crash anywhere before it leaves a partial unit, which a rerun removes whole
    (remove_partial), merged file included, so no row is ever counted twice or lost."""
    directory = store.trace_directory(unit)
    if store.fs.get_file_info(directory).type == FileType.NotFound:
        return None
    parts = sorted(
        info.path
        for info in store.fs.get_file_info(FileSelector(directory))
        if info.base_name.startswith(unit.part_prefix) and info.base_name.endswith(".parquet")
    )
    if len(parts) < 2:
        return None
    footers = [_footer(store, path) for path in parts]
    schema, total = footers[0].schema.to_arrow_schema(), sum(f.num_rows for f in footers)
    if any(not f.schema.to_arrow_schema().equals(schema) for f in footers):
        log.warning("unit.parts_not_merged", unit=unit.key, reason="part files of different schemas")
        return None
    name = f"{unit.part_prefix}{MERGED_WORKER}-000000-{uuid.uuid4().hex[:8]}.parquet"
    temporary, merged = f"{directory}/.tmp-{name}", f"{directory}/{name}"
    with store.fs.open_output_stream(temporary) as sink, pq.ParquetWriter(sink, schema, compression="zstd") as out:
        pending = schema.empty_table()
        for path in parts:
            with store.fs.open_input_file(path) as handle:
                pending = pa.concat_tables([pending, pq.read_table(handle)])
            full = pending.num_rows - pending.num_rows % MERGED_ROW_GROUP  # whole row groups out, the rest waits
            if full:
                out.write_table(pending.slice(0, full), row_group_size=MERGED_ROW_GROUP)
                pending = pending.slice(full)
        if pending.num_rows:
            out.write_table(pending, row_group_size=MERGED_ROW_GROUP)
    store.fs.move(temporary, merged)
    written = _footer(store, merged).num_rows
    if written != total:  # never delete a row that is not in the merged file
        store.fs.delete_file(merged)
        log.error("unit.parts_not_merged", unit=unit.key, reason=f"merged {written} rows of {total}")
        return None
    for path in parts:
        store.fs.delete_file(path)
    log.info("unit.parts_merged", unit=unit.key, parts=len(parts), rows=total)
    return merged


def _footer(store: RunStore, path: str) -> pq.FileMetaData:
    return parquet_metadata(store.fs, path, "a trace part file")


def unit_tpot_p50(store: RunStore, unit: Unit) -> float | None:
    """Median TPOT of the unit's ok requests, from its own part files (a progress line per unit, not the report)."""
    directory = store.trace_directory(unit)
    if store.fs.get_file_info(directory).type == FileType.NotFound:
        return None
    values: list[float] = []
    for info in store.fs.get_file_info(FileSelector(directory)):
        if not info.base_name.startswith(unit.part_prefix):
            continue
        with store.fs.open_input_file(info.path) as handle:
            table = pq.read_table(handle, columns=["tpot_s", "status"])
        values.extend(t for t, status in zip(table.column("tpot_s").to_pylist(), table.column("status").to_pylist(),
                                             strict=True) if status == "ok" and t is not None)  # fmt: skip
    if not values:
        return None
    values.sort()
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def rows_on_disk(store: RunStore, unit: Unit, workers: Sequence[int]) -> int:
    """Rows a lost worker had flushed before it died (its part files carry its writer id)."""
    directory = store.trace_directory(unit)
    if store.fs.get_file_info(directory).type == FileType.NotFound:
        return 0
    prefixes = tuple(f"{unit.part_prefix}{w}-" for w in workers)
    total = 0
    for info in store.fs.get_file_info(FileSelector(directory)):
        if info.base_name.startswith(prefixes):
            total += parquet_metadata(store.fs, info.path, "a trace part file").num_rows
    return total
