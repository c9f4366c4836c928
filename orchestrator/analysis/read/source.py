"""What the analysis reads, as DuckDB views: `trace` (the rows of complete units), `runs` (one row per run of a
shape on an arm: its clock), `requests` (one row per request: the measures every map and check is built from)
and, where the run has them, `steps` (the engines' step timelines, one row per engine step).

A run's trace is read where it lies (`run_views.py`: `read_parquet` over its part files with Hive partitioning); a
table in memory (tests, tools) is registered as it is. Nothing here holds a row in Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from loadshapes.shapes import ShapeBase
from loadshapes.trace import ADDED_COLUMNS, PARTITION_COLUMNS, TRACE_SCHEMA
from orchestrator.analysis.read.db import EngineSettings, close, connect, sql_string
from orchestrator.analysis.read.files import RunFiles
from orchestrator.analysis.read.footer import RUN_GROUPS_DECIDED_SQL, RUN_GROUPS_SQL

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
       coalesce(t.drafted_tokens, 0)::BIGINT AS drafted,
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
    columns = ", ".join(f"t.{c}" for c in TRACE_SCHEMA.names if c not in (*PARTITION_COLUMNS, *ADDED_COLUMNS))
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


def finish(con: duckdb.DuckDBPyConnection, run_starts: Mapping[RunKey, int] | None, step_arms: frozenset[str],
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
    requests = finish(con, run_starts, frozenset(), has_steps=False)
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
