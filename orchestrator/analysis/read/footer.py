"""What a trace's Parquet footers say without reading a row: per row group, its (arm, shape) from the path and,
for the columns below, the minimum, maximum and null count the writer recorded. A run's clock (`runs`) and an
arm's engine config are constant over a row group in every trace specdrill writes (a part file holds one
unit's rows), so the statistics decide them exactly; where they do not (a column without statistics, a row
group spanning two runs or configs), the caller scans the rows instead and gets the same answer, slower.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa

# Columns whose statistics the analysis reads: the run clock, and the engine telemetry verification checks.
FOOTER_COLUMNS = (
    "run",
    "repeat",
    "scheduled_ns",
    "unit_start_ns",
    "resolved_speculative_config",
    "schedule_dropped",
    "drafted_tokens",
)


def _pivot(column: str) -> str:
    """One column's statistics as columns of its row group: <c>_min, <c>_max (NULL where not exact), <c>_nulls."""
    exact = "coalesce(min_is_exact, false) AND coalesce(max_is_exact, false)"
    where = f"path_in_schema = '{column}'"
    return (
        f"any_value(CASE WHEN {where} AND {exact} THEN stats_min_value END) AS {column}_min, "
        f"any_value(CASE WHEN {where} AND {exact} THEN stats_max_value END) AS {column}_max, "
        f"any_value(CASE WHEN {where} THEN stats_null_count END) AS {column}_nulls"
    )


def footer_table(con: duckdb.DuckDBPyConnection, files: Sequence[tuple[str, str, str]]) -> bool:
    """`trace_footer`: one row per row group of `files` (path, arm, shape): arm, shape, rows and the statistics
    of FOOTER_COLUMNS; False (and no table) when there are no files."""
    if not files:
        return False
    con.register(
        "footer_files",
        pa.table(
            {
                "file_name": pa.array([f[0] for f in files], pa.string()),
                "arm": pa.array([f[1] for f in files], pa.string()),
                "shape": pa.array([f[2] for f in files], pa.string()),
            }
        ),
    )
    listed = ", ".join("'" + f[0].replace("'", "''") + "'" for f in files)
    wanted = ", ".join(f"'{c}'" for c in FOOTER_COLUMNS)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE trace_footer AS
        SELECT f.arm, f.shape, m.file_name, m.row_group_id, any_value(m.row_group_num_rows) AS rows,
               {", ".join(_pivot(c) for c in FOOTER_COLUMNS)}
        FROM parquet_metadata([{listed}]) m JOIN footer_files f USING (file_name)
        WHERE m.path_in_schema IN ({wanted})
        GROUP BY f.arm, f.shape, m.file_name, m.row_group_id
        """
    )
    return True


# The run groups of `runs` (source._RUNS_SQL) from the footers: exact when every row group of a complete unit
# pins its run and repeat to one value and records its scheduled times (a row group whose scheduled_ns are all
# NULL has no minimum, as the rows' min() would have none).
RUN_GROUPS_DECIDED_SQL = """
SELECT bool_and(run_min IS NOT NULL AND run_min = run_max AND run_nulls = 0
                AND repeat_min IS NOT NULL AND repeat_min = repeat_max AND repeat_nulls = 0
                AND scheduled_ns_nulls IS NOT NULL AND unit_start_ns_nulls IS NOT NULL
                AND (scheduled_ns_min IS NOT NULL OR scheduled_ns_nulls = rows)
                AND (unit_start_ns_min IS NOT NULL OR unit_start_ns_nulls = rows))
FROM trace_footer
"""

RUN_GROUPS_SQL = """
SELECT f.arm, f.shape, f.run_min AS run, f.repeat_min::INTEGER AS repeat, sum(f.rows) AS rows,
       min(f.scheduled_ns_min::BIGINT) AS first_ns, max(f.scheduled_ns_max::BIGINT) AS last_ns,
       min(f.unit_start_ns_min::BIGINT) AS unit_start_ns
FROM trace_footer f JOIN complete_units u ON f.arm = u.arm AND f.shape = u.shape AND f.repeat_min::INTEGER = u.repeat
GROUP BY ALL
"""
