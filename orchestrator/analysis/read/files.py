"""The Parquet files a run's views read, and which of them a failed query came from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from loadshapes.badfile import parquet_metadata, parquet_problem
from orchestrator.analysis.read.db import sql_string

TRACE_FILE = "a trace part file"
TIMELINE_FILE = "a step timeline"


@dataclass
class RunFiles:
    """The Parquet files the views over a run read, (path, what it is), on one filesystem."""

    fs: pafs.FileSystem
    files: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def blame(self, exc: Exception) -> Exception:
        """The file a reader's error comes from: each file read in full on its own, by Arrow and (on a local disk)
        by DuckDB, the first that fails named in its reader's words; `exc` itself where every file reads. Only
        run after a failure: it costs a second scan."""
        local = isinstance(self.fs, pafs.LocalFileSystem)
        for path, what in self.files:
            parquet_metadata(self.fs, path, what)
            try:
                with self.fs.open_input_file(path) as handle:
                    for _ in pq.ParquetFile(handle).iter_batches(batch_size=65_536):
                        pass
                if local:
                    con = duckdb.connect()
                    try:
                        for _ in con.sql(f"SELECT * FROM read_parquet({sql_string(path)})").to_arrow_reader(65_536):
                            pass
                    finally:
                        con.close()
            except (pa.ArrowException, OSError, duckdb.Error) as found:
                return parquet_problem(self.fs, path, what, found)
        return exc
