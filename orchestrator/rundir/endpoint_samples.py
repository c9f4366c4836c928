"""An endpoint arm's /metrics samples in the run directory, `endpoint_metrics/arm=/shape=/r<repeat>.parquet`, one
row per scrape: taken while a unit runs (orchestrator/execute/endpoint_scrape.py), read by the analysis. The file
format lives here, below both, so that reading a run never imports the scraper."""

from __future__ import annotations

from urllib.parse import quote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from loadshapes.trace import filesystem
from serve_apps.engine_kinds.dialects.base import COUNTER_KEYS

ROOT = "endpoint_metrics"

SCHEMA = pa.schema(
    [
        pa.field("time_ns", pa.int64()),
        pa.field("running", pa.float64()),  # summed over the server's engines (DP ranks)
        pa.field("waiting", pa.float64()),
        pa.field("engines", pa.int32()),  # label sets reporting `running`: one per engine
        # The dialect's counters (serve_apps/engine_kinds/dialects/base.py COUNTER_KEYS); null where the server
        # exports no such counter (no speculation, or a server that counts something else).
        *(pa.field(key, pa.float64()) for key in COUNTER_KEYS),
        pa.field("draft_length", pa.float64()),  # the server's draft-length gauge, where it exports one
    ]
)


def unit_path(root: str, arm: str, shape: str, repeat: int) -> str:
    return f"{root}/{ROOT}/arm={quote(arm, safe='')}/shape={quote(shape, safe='')}/r{repeat}.parquet"


def write_samples(run_root: str, arm: str, shape: str, repeat: int, table: pa.Table) -> int:
    fs, base = filesystem(run_root)
    path = unit_path(base, arm, shape, repeat)
    directory = path.rsplit("/", 1)[0]
    fs.create_dir(directory, recursive=True)
    temporary = f"{directory}/.tmp-r{repeat}.parquet"
    with fs.open_output_stream(temporary) as sink:
        pq.write_table(table, sink, compression="zstd")
    fs.move(temporary, path)
    return int(table.num_rows)


def read_samples(run_root: str, units: list[tuple[str, str, int]]) -> pa.Table:
    """Every complete unit's samples, with arm, shape and repeat columns; empty when the run has none."""
    fs, base = filesystem(run_root)
    parts = []
    for arm, shape, repeat in units:
        path = unit_path(base, arm, shape, repeat)
        if fs.get_file_info(path).type != pafs.FileType.File:
            continue
        with fs.open_input_file(path) as handle:
            part = pq.read_table(handle)
        # A file written before a column existed (generation_tokens, draft_length) reads it as nulls.
        part = pa.table(
            {
                f.name: part.column(f.name) if f.name in part.column_names else pa.nulls(part.num_rows, f.type)
                for f in SCHEMA
            },
            schema=SCHEMA,
        )
        n = part.num_rows
        parts.append(
            part.append_column("arm", pa.array([arm] * n, pa.string()))
            .append_column("shape", pa.array([shape] * n, pa.string()))
            .append_column("repeat", pa.array([repeat] * n, pa.int32()))
        )
    if not parts:
        empty = SCHEMA.append(pa.field("arm", pa.string())).append(pa.field("shape", pa.string()))
        return pa.Table.from_batches([], schema=empty.append(pa.field("repeat", pa.int32())))
    return pa.concat_tables(parts)
