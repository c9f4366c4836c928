"""The analysis engine: DuckDB, with a memory limit and a thread count the caller can set.

DuckDB streams the trace's Parquet files through its GROUP BYs and joins and spills to disk past its memory
limit, so the report's memory does not grow with the trace; numpy only sees the small aggregates it returns.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping

import duckdb
from pydantic import BaseModel, ConfigDict, Field

_PRIVATE_SPILL = "specdrill-duckdb-"


class EngineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # DuckDB's buffer pool; what a query or a temporary table needs beyond it goes to temp_directory (exact
    # quantiles excepted: their values stay in memory, one arm's four measures at a time). 512 MB kept the
    # report of 10 million rows under 0.8 GiB of RSS; 256 MB ran out (benchmarks/bench_report.py).
    memory_limit: str = "512MB"
    threads: int | None = Field(default=None, ge=1)  # None: DuckDB's default, one per core
    temp_directory: str | None = None  # None: a private directory in the system's, removed on close

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineSettings:
        """SPECDRILL_DUCKDB_MEMORY_LIMIT, SPECDRILL_DUCKDB_THREADS, SPECDRILL_DUCKDB_TEMP_DIRECTORY where set."""
        env = os.environ if environ is None else environ
        values: dict[str, str | int] = {}
        if env.get("SPECDRILL_DUCKDB_MEMORY_LIMIT"):
            values["memory_limit"] = env["SPECDRILL_DUCKDB_MEMORY_LIMIT"]
        if env.get("SPECDRILL_DUCKDB_THREADS"):
            values["threads"] = int(env["SPECDRILL_DUCKDB_THREADS"])
        if env.get("SPECDRILL_DUCKDB_TEMP_DIRECTORY"):
            values["temp_directory"] = env["SPECDRILL_DUCKDB_TEMP_DIRECTORY"]
        return cls.model_validate(values)


def connect(settings: EngineSettings | None = None) -> duckdb.DuckDBPyConnection:
    chosen = settings or EngineSettings()
    con = duckdb.connect(":memory:")
    con.execute(f"SET memory_limit = {sql_string(chosen.memory_limit)}")
    if chosen.threads is not None:
        con.execute(f"SET threads = {int(chosen.threads)}")
    # DuckDB's own default spill directory is .tmp in the working directory, which may not be writable or may
    # be a user's checkout: spill to a private directory unless one was chosen.
    spill = chosen.temp_directory or tempfile.mkdtemp(prefix=_PRIVATE_SPILL)
    if chosen.temp_directory is None:
        atexit.register(shutil.rmtree, spill, True)  # a caller that never closes (a script) leaves nothing
    con.execute(f"SET temp_directory = {sql_string(spill)}")
    # Row order is never needed (every result is grouped and sorted explicitly); without it scans and
    # aggregates need less memory.
    con.execute("SET preserve_insertion_order = false")
    # Every query over the trace reads its part files' footers again otherwise: a run writes a part file per
    # 1000 rows, so a report's dozen scans of 10 M rows would each parse 10,000 footers.
    con.execute("SET parquet_metadata_cache = true")
    return con


def close(con: duckdb.DuckDBPyConnection) -> None:
    """Close the connection and remove its private spill directory."""
    row = con.execute("SELECT current_setting('temp_directory')").fetchone()
    con.close()
    if row and row[0] and os.path.basename(str(row[0]).rstrip("/")).startswith(_PRIVATE_SPILL):
        shutil.rmtree(str(row[0]), ignore_errors=True)


def sql_string(value: str) -> str:
    """A SQL string literal (for the few names DuckDB cannot take as parameters: view bodies)."""
    return "'" + value.replace("'", "''") + "'"


def sql_list(values: Iterable[str]) -> str:
    """A parenthesised list of SQL string literals, for `IN`: literal values let DuckDB skip the files of a
    per-run view whose constant arm is not among them (a parameter list does not)."""
    literals = [sql_string(v) for v in values]
    return "(" + ", ".join(literals) + ")" if literals else "(NULL)"
