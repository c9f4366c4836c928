"""What the analysis reads, as DuckDB views: `trace` (the rows of complete units), `runs` (one row per run of a
shape on an arm: its clock), `requests` (one row per request: the measures every map and check is built from)
and, where the run has them, `steps` (the engines' step timelines, one row per engine step).

A run's trace is read where it lies (`read_parquet` over its part files with Hive partitioning); a table in
memory (tests, tools) is registered as it is. Nothing here holds a row in Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from loadshapes.badfile import parquet_metadata, parquet_problem
from loadshapes.shapes import ShapeBase
from loadshapes.trace import PARTITION_COLUMNS, TRACE_SCHEMA, check_trace_version, filesystem
from orchestrator.analysis.db import EngineSettings, close, connect, sql_string
from orchestrator.analysis.footer import RUN_GROUPS_DECIDED_SQL, RUN_GROUPS_SQL, footer_table

RunKey = tuple[str, str, str, int]  # arm, shape, run, repeat
UnitKey = tuple[str, str, int]  # arm, shape, repeat
# A ramp from zero would let one early request stand for minutes of clock: each request stands for at most
# the gap its run's mean rate would leave, times this.
MAX_CLOCK_STRETCH = 20.0


def _measure(column: str) -> str:
    """NaN as NULL: DuckDB orders NaN above every number (numpy's comparisons are false), and NULL is what every
    aggregate here skips."""
    return f"CASE WHEN isnan(t.{column}) THEN NULL ELSE t.{column} END"


# A run's rows, first and last scheduled time and unit start: from the rows, or the same figures from the
# footers (footer.RUN_GROUPS_SQL) where their statistics decide them.
_RUN_GROUPS_SQL = """
SELECT arm, shape, run, repeat, count(*) AS rows, min(scheduled_ns) AS first_ns, max(scheduled_ns) AS last_ns,
       min(unit_start_ns) AS unit_start_ns
FROM trace GROUP BY arm, shape, run, repeat
"""

_RUNS_SQL = """
CREATE OR REPLACE TEMP TABLE runs AS
SELECT (row_number() OVER (ORDER BY g.arm, g.shape, g.run, g.repeat))::INTEGER AS run_id,
       (dense_rank() OVER (ORDER BY g.arm))::INTEGER AS arm_id,
       (dense_rank() OVER (ORDER BY g.shape, g.repeat))::INTEGER AS pair_unit, g.*,
       coalesce(s.start_ns, g.unit_start_ns, g.first_ns) AS start_ns,
       (g.last_ns - g.first_ns) / 1e9 AS span_s,
       CASE WHEN g.last_ns > g.first_ns THEN (g.rows - 1) / ((g.last_ns - g.first_ns) / 1e9) END AS mean_rate
FROM ({groups}) g
LEFT JOIN run_starts s USING (arm, shape, run, repeat)
"""


def _request_columns(start_ns: str) -> str:
    """A request's measures, `start_ns` its run's start (a column of `runs`, or a constant)."""
    return f"""t.request_index, t.category, t.status = 'ok' AS ok,
       {_measure("ttft_s")} AS ttft, {_measure("tpot_s")} AS tpot, {_measure("e2e_s")} AS e2e,
       {_measure("queue_wait_s")} AS queue_wait,
       {_measure("step_batch_mean")} AS typical_batch,
       coalesce(t.engine_steps, 0)::INTEGER AS steps, coalesce(t.step_k_sum, 0)::BIGINT AS k_sum,
       coalesce(t.spec_steps, 0)::INTEGER AS spec_steps, coalesce(t.accepted_tokens, 0)::BIGINT AS accepted,
       (t.scheduled_ns - {start_ns}) / 1e9 AS offset_s,
       {_measure("offered_rate_rps")} AS offered_rate"""


# One row per request: its run's names, clock and keys (from `runs`: arm_id numbers the arms, pair_unit the (shape,
# repeat) pairs whose requests are paired across arms by request_index) and the measures every map and check uses.
_REQUESTS_SQL = f"""
CREATE OR REPLACE TEMP VIEW requests AS
SELECT r.arm, r.shape, r.run, r.repeat, r.run_id, r.arm_id, r.pair_unit, {_request_columns("r.start_ns")},
       r.span_s, r.mean_rate
FROM trace t JOIN runs r ON t.arm = r.arm AND t.shape = r.shape AND t.run = r.run AND t.repeat = r.repeat
"""

# Each part file's run, where the footers pin every row group of the file to one (run, repeat); only complete
# units' runs are in `runs`, so a partial unit's files drop out here.
_FILE_RUNS_SQL = """
SELECT f.file_name, f.single, r.run_id, r.arm_id, r.pair_unit, r.arm, r.shape, r.run, r.repeat, r.start_ns,
       r.span_s, r.mean_rate
FROM (
    SELECT file_name, arm, shape, any_value(run_min) AS run, any_value(repeat_min)::INTEGER AS repeat,
           count(DISTINCT run_min) = 1 AND count(DISTINCT repeat_min) = 1 AS single
    FROM trace_footer GROUP BY file_name, arm, shape
) f LEFT JOIN runs r USING (arm, shape, run, repeat)
ORDER BY r.run_id, f.file_name
"""


def _literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return sql_string(value)
    if isinstance(value, float):
        return f"{value!r}::DOUBLE"
    return f"{int(value)}::BIGINT"  # type: ignore[call-overload]


def _per_run_views(con: duckdb.DuckDBPyConnection) -> bool:
    """`trace` and `requests` as one scan per run with its names and clock as constants, where the footers say
    which run each part file holds: no join of every row to `complete_units` and `runs` on string keys (at
    10 M rows those joins cost as much as reading the measures). False (views untouched) where they do not."""
    found = con.execute(_FILE_RUNS_SQL).fetchall()
    if not found or not all(single for _, single, *_ in found):
        return False
    runs: dict[int, tuple[tuple[Any, ...], list[str]]] = {}
    for file_name, _, run_id, *clock in found:
        if run_id is not None:  # None: a partial unit's file
            runs.setdefault(int(run_id), (tuple(clock), []))[1].append(str(file_name))
    if not runs:
        return False
    columns = ", ".join(f"t.{c}" for c in TRACE_SCHEMA.names if c not in PARTITION_COLUMNS)
    traces, requests = [], []
    for run_id, ((arm_id, pair_unit, arm, shape, run, repeat, start_ns, span_s, mean_rate), files) in sorted(
        runs.items()
    ):
        listed = ", ".join(sql_string(f) for f in files)
        source = f"read_parquet([{listed}], union_by_name = true) t"
        names = f"{_literal(arm)} AS arm, {_literal(shape)} AS shape"
        traces.append(f"SELECT {names}, {columns} FROM {source}")
        requests.append(
            f"SELECT {names}, {_literal(run)} AS run, {int(repeat)}::INTEGER AS repeat, {run_id}::INTEGER AS run_id, "
            f"{int(arm_id)}::INTEGER AS arm_id, {int(pair_unit)}::INTEGER AS pair_unit, "
            f"{_request_columns(_literal(start_ns))}, {_literal(span_s)} AS span_s, {_literal(mean_rate)} AS mean_rate "
            f"FROM {source}"
        )
    con.execute("CREATE OR REPLACE TEMP VIEW trace AS " + " UNION ALL ".join(traces))
    con.execute("CREATE OR REPLACE TEMP VIEW requests AS " + " UNION ALL ".join(requests))
    return True


# Each request stands for 1/rate seconds of its run, summed over a band: the time the band lasted. The rate is
# the offered rate (at least the run's mean rate / MAX_CLOCK_STRETCH) where known, else the run's mean rate
# (closed loop).
CLOCK_SQL = f"""
CASE WHEN offered_rate > 0
     THEN CASE WHEN mean_rate IS NULL THEN 0.0 ELSE 1.0 / greatest(offered_rate, mean_rate / {MAX_CLOCK_STRETCH}) END
     WHEN mean_rate > 0 THEN 1.0 / mean_rate ELSE 0.0 END
"""


@dataclass(frozen=True)
class Requests:
    """A connection holding the views above; `arms`: those with rows, by name."""

    con: duckdb.DuckDBPyConnection
    arms: tuple[str, ...]
    has_steps: bool  # the `steps` view exists (a run with engine step timelines)
    step_arms: frozenset[str]  # arms whose steps come from the timelines (the rest: the rows' per-step lists)
    has_footers: bool = False  # `trace_footer` holds the trace files' Parquet statistics (footer.footer_table)
    # what the views read, where they read a run
    files: RunFiles | None = dataclasses.field(default=None, compare=False)

    def blame(self, exc: Exception) -> Exception:
        """For a query over the views that failed: the BadFileError naming the file DuckDB failed on (a corrupt
        page is found only when it is scanned), or `exc` itself where no single file explains it."""
        return exc if self.files is None else self.files.blame(exc)

    def __len__(self) -> int:
        row = self.con.execute("SELECT count(*) FROM trace").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        close(self.con)


def _finish(con: duckdb.DuckDBPyConnection, run_starts: Mapping[RunKey, int] | None, step_arms: frozenset[str],
            has_steps: bool, *, footers: bool = False) -> Requests:  # fmt: skip
    """`footers`: `trace_footer` holds the trace files' statistics (footer.footer_table)."""
    starts = pa.table(
        {
            "arm": pa.array([k[0] for k in (run_starts or {})], pa.string()),
            "shape": pa.array([k[1] for k in (run_starts or {})], pa.string()),
            "run": pa.array([k[2] for k in (run_starts or {})], pa.string()),
            "repeat": pa.array([k[3] for k in (run_starts or {})], pa.int32()),
            "start_ns": pa.array(list((run_starts or {}).values()), pa.int64()),
        }
    )
    con.register("run_starts", starts)
    decided = footers and bool((con.execute(RUN_GROUPS_DECIDED_SQL).fetchone() or (False,))[0])
    con.execute(_RUNS_SQL.format(groups=RUN_GROUPS_SQL if decided else _RUN_GROUPS_SQL))
    if not (decided and _per_run_views(con)):
        con.execute(_REQUESTS_SQL)
    arms = tuple(r[0] for r in con.execute("SELECT DISTINCT arm FROM runs ORDER BY arm").fetchall())
    return Requests(con=con, arms=arms, has_steps=has_steps, step_arms=step_arms, has_footers=footers)


def _plain_strings(table: pa.Table) -> pa.Table:
    """Dictionary-encoded string columns (pyarrow's dataset reader makes them) as plain strings."""
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table[field.name].cast(field.type.value_type))
    return table


def _with_trace_columns(table: pa.Table) -> pa.Table:
    """A table with only some of the trace's columns (tests, tools) gets the rest as nulls."""
    n = table.num_rows
    for field in TRACE_SCHEMA:
        if field.name not in table.column_names:
            table = table.append_column(field.name, pa.nulls(n, field.type))
    return _plain_strings(table)


def request_frame(
    table: pa.Table,
    *,
    shapes: Mapping[str, ShapeBase] | None = None,
    offered_rate: np.ndarray | None = None,
    run_starts: Mapping[RunKey, int] | None = None,
    settings: EngineSettings | None = None,
) -> Requests:
    """The views over a trace table in memory. The offered rate is the trace's `offered_rate_rps`, or else
    `offered_rate` (per row) or the rate of `shapes` at each row's scheduled time."""
    if offered_rate is not None and len(offered_rate) != table.num_rows:
        raise ValueError(f"offered_rate has {len(offered_rate)} values for {table.num_rows} rows")
    table = _with_trace_columns(table)
    con = connect(settings)
    if offered_rate is not None:
        table = table.set_column(
            table.schema.get_field_index("offered_rate_rps"),
            "offered_rate_rps",
            pa.array(np.asarray(offered_rate, dtype=np.float64), pa.float64()),
        )
    con.register("trace", table)
    requests = _finish(con, run_starts, frozenset(), has_steps=False)
    if offered_rate is None and shapes and table["offered_rate_rps"].null_count == table.num_rows:
        # A trace without planning-time rates (built by hand): the shapes' rates at the scheduled offsets.
        rates = _shape_rates(con, table, shapes)
        requests.close()
        return request_frame(table, offered_rate=rates, run_starts=run_starts, settings=settings)
    return requests


def _shape_rates(con: duckdb.DuckDBPyConnection, table: pa.Table, shapes: Mapping[str, ShapeBase]) -> np.ndarray:
    """Per row of `table`, in its order: the shape's offered rate at the row's offset on its run's clock."""
    numbered = table.select(["arm", "shape", "run", "repeat", "scheduled_ns"]).append_column(
        "row_number", pa.array(np.arange(table.num_rows, dtype=np.int64))
    )
    con.register("numbered", numbered)
    found = con.sql(
        "SELECT n.row_number, n.shape, (n.scheduled_ns - r.start_ns) / 1e9 AS offset_s FROM numbered n "
        "JOIN runs r USING (arm, shape, run, repeat) ORDER BY n.row_number"
    ).to_arrow_table()
    rows = found["row_number"].to_numpy()
    shape_names = np.asarray(found["shape"].to_pylist(), dtype=object)
    offsets = found["offset_s"].to_numpy()
    rates = np.full(table.num_rows, np.nan)
    for name, shape in shapes.items():
        if not shape.open_loop:
            continue
        mine = shape_names == name
        rates[rows[mine]] = shape.rate_at(offsets[mine])
    return rates


# --- a run's files --------------------------------------------------------------------------------------------
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


def _part_files(fs: pafs.FileSystem, directory: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.endswith(".parquet") and not i.base_name.startswith(".")
    )


def _units_table(units: Sequence[UnitKey]) -> pa.Table:
    return pa.table(
        {
            "arm": pa.array([u[0] for u in units], pa.string()),
            "shape": pa.array([u[1] for u in units], pa.string()),
            "repeat": pa.array([u[2] for u in units], pa.int32()),
            "arm_path": pa.array([quote(u[0], safe="") for u in units], pa.string()),
            "shape_path": pa.array([quote(u[1], safe="") for u in units], pa.string()),
        }
    )


def _trace_view(
    con: duckdb.DuckDBPyConnection, root: str, units: Sequence[UnitKey], read: RunFiles
) -> list[tuple[str, str, str]]:
    """`trace`: the rows of the complete units only (a partial unit's rows are not evidence: the rerun redoes
    it), by partition (only their directories are listed) and by unit (a join on arm, shape, repeat). Returns
    the part files on a local disk (path, arm, shape), whose footers DuckDB can read."""
    fs, base = filesystem(root)
    con.register("complete_units", _units_table(units))
    pairs = sorted({(u[0], u[1]) for u in units})
    local = isinstance(fs, pafs.LocalFileSystem)
    located = [
        (f, arm, shape)
        for arm, shape in pairs
        for f in _part_files(fs, f"{base}/arm={quote(arm, safe='')}/shape={quote(shape, safe='')}")
    ]
    files = [f for f, _, _ in located]
    read.files += [(f, TRACE_FILE) for f in files]
    columns = ", ".join(f"t.{c}" for c in TRACE_SCHEMA.names if c not in PARTITION_COLUMNS)
    if not files:
        empty = pa.Table.from_batches([], schema=TRACE_SCHEMA)
        con.register("trace_files", empty)
        source = "trace_files"
        arm_key, shape_key = "arm", "shape"
    elif local:
        listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
        source = (
            f"read_parquet([{listed}], hive_partitioning = true, "
            "hive_types = {'arm': VARCHAR, 'shape': VARCHAR}, union_by_name = true)"
        )
        arm_key, shape_key = "arm_path", "shape_path"  # the path segments, as the writer quoted them
    else:  # object stores: pyarrow's filesystems, streamed into DuckDB batch by batch
        dataset = ds.dataset(
            files,
            filesystem=fs,
            format="parquet",
            partitioning=ds.partitioning(pa.schema([(c, pa.string()) for c in PARTITION_COLUMNS]), flavor="hive"),
            partition_base_dir=base,
        )
        con.register("trace_files", dataset)
        source = "trace_files"
        arm_key, shape_key = "arm", "shape"
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW trace AS SELECT u.arm, u.shape, {columns} FROM {source} t "
        f"JOIN complete_units u ON t.arm = u.{arm_key} AND t.shape = u.{shape_key} AND t.repeat = u.repeat"
    )
    return located if local else []


def steps_view(
    con: duckdb.DuckDBPyConnection, run_dir: str, units: Sequence[UnitKey], read: RunFiles | None = None
) -> frozenset[str]:
    """`steps`: every engine step of the complete units' timelines (arm, shape, repeat, engine_id, start_ns,
    end_ns, batch_size, k); the arms that have one."""
    fs, base = filesystem(run_dir)
    found = []
    for arm, shape, repeat in units:
        path = f"{base}/timelines/arm={quote(arm, safe='')}/shape={quote(shape, safe='')}/r{repeat}.parquet"
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            continue
        # empty: no steps (or an endpoint unit of an older specdrill)
        if parquet_metadata(fs, path, TIMELINE_FILE).num_rows:
            found.append((path, arm, shape, repeat))
            if read is not None:
                read.files.append((path, TIMELINE_FILE))
    if not found:
        return frozenset()
    con.register(
        "timeline_files",
        pa.table(
            {
                "filename": pa.array([f[0] for f in found], pa.string()),
                "arm": pa.array([f[1] for f in found], pa.string()),
                "shape": pa.array([f[2] for f in found], pa.string()),
                "repeat": pa.array([f[3] for f in found], pa.int32()),
            }
        ),
    )
    if isinstance(fs, pafs.LocalFileSystem):
        listed = ", ".join("'" + f[0].replace("'", "''") + "'" for f in found)
        source = f"read_parquet([{listed}], filename = true, union_by_name = true)"
    else:
        tables = []
        for path, *_ in found:
            with fs.open_input_file(path) as handle:
                part = pq.read_table(handle, columns=["engine_id", "start_ns", "end_ns", "batch_size", "k"])
            tables.append(part.append_column("filename", pa.array([path] * part.num_rows, pa.string())))
        con.register("timeline_rows", pa.concat_tables(tables))
        source = "timeline_rows"
    con.execute(
        "CREATE OR REPLACE TEMP VIEW steps AS SELECT f.arm, f.shape, f.repeat, s.engine_id, s.start_ns, s.end_ns, "
        f"s.batch_size, s.k FROM {source} s JOIN timeline_files f ON s.filename = f.filename"
    )
    return frozenset(f[1] for f in found)


def run_requests(
    run_dir: str,
    units: Sequence[UnitKey],
    *,
    settings: EngineSettings | None = None,
    step_lists_only: frozenset[str] = frozenset(),
) -> Requests:
    """The views over a run directory's traces and timelines, complete units only. `step_lists_only`: arms whose
    steps come from the rows' per-step lists even where a timeline exists."""
    traces = f"{run_dir.rstrip('/')}/traces"
    check_trace_version(traces)
    read = RunFiles(filesystem(traces)[0])
    con = connect(settings or EngineSettings.from_env())
    try:
        try:
            local_files = _trace_view(con, traces, units, read)
            footers = footer_table(con, local_files)
            step_arms = steps_view(con, run_dir.rstrip("/"), units, read) - step_lists_only
            requests = _finish(con, None, step_arms, has_steps=bool(step_arms), footers=footers)
        except duckdb.Error as exc:
            raise read.blame(exc) from None
    except BaseException:
        close(con)
        raise
    return dataclasses.replace(requests, files=read)
