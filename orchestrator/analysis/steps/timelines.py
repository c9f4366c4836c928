"""The engine step timelines as the report draws them: per unit, executed k and batch size over time, at most
`max_points` points (equal-time buckets: mean k, max batch size) once a unit has more steps than that or more
than one engine.

DuckDB buckets the steps where they lie, so a day of steps never becomes one table in memory; a step table
already in memory goes through the same queries (`series_of_table`). A step without a k (vLLM reports none for a
step whose drafts no request verified) is counted but not drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from orchestrator.analysis.read.db import connect
from orchestrator.analysis.read.source import Requests

MAX_POINTS = 2000  # per series in a timeline chart; longer timelines are bucketed by time


@dataclass(frozen=True)
class TimelineSeries:
    t: np.ndarray  # seconds since the unit's start, ascending
    k: np.ndarray  # executed k (mean per bucket when bucketed)
    batch: np.ndarray  # batch size (max per bucket when bucketed)
    end: float  # the last step's end, seconds since the unit's start
    steps: int
    engines: int
    bucketed: bool
    early: int  # steps before the unit's start, not drawn


# Per unit, in one pass over its steps: its origin (the unit's start, or its first step where the start is
# unknown or after its last step) and what is drawn from it. Both origins' counts are taken in the same pass (the
# start's as FILTERs), as joining the steps to a per-unit aggregate of themselves read them twice and let DuckDB
# hash the steps rather than the dozen units.
_SHAPE_SQL = """
SELECT arm, shape, repeat, steps, engines, last_end,
       CASE WHEN from_first THEN first_any ELSE unit_start END AS origin,
       CASE WHEN from_first THEN steps ELSE inside_u END AS inside,
       CASE WHEN from_first THEN drawn_all ELSE drawn_u END AS drawn,
       CASE WHEN from_first THEN first_all ELSE first_u END AS first_ns,
       CASE WHEN from_first THEN last_all ELSE last_u END AS last_ns
FROM (
    SELECT *, (unit_start IS NULL OR unit_start > last_any) AS from_first
    FROM (
        SELECT s.arm, s.shape, s.repeat, any_value(u.start_ns) AS unit_start, count(*) AS steps,
               count(DISTINCT s.engine_id) AS engines, min(s.start_ns) AS first_any, max(s.start_ns) AS last_any,
               max(s.end_ns) AS last_end, count(s.k) AS drawn_all,
               min(s.start_ns) FILTER (WHERE s.k IS NOT NULL) AS first_all,
               max(s.start_ns) FILTER (WHERE s.k IS NOT NULL) AS last_all,
               count(*) FILTER (WHERE s.start_ns >= u.start_ns) AS inside_u,
               count(s.k) FILTER (WHERE s.start_ns >= u.start_ns) AS drawn_u,
               min(s.start_ns) FILTER (WHERE s.k IS NOT NULL AND s.start_ns >= u.start_ns) AS first_u,
               max(s.start_ns) FILTER (WHERE s.k IS NOT NULL AND s.start_ns >= u.start_ns) AS last_u
        FROM steps s LEFT JOIN timeline_unit_starts u USING (arm, shape, repeat)
        GROUP BY s.arm, s.shape, s.repeat
    )
)
"""


def timeline_series(
    requests: Requests, unit_starts: Mapping[str, int], *, max_points: int = MAX_POINTS
) -> dict[str, TimelineSeries]:
    """Per unit ("arm/shape/r<repeat>"), its series; `unit_starts`: each unit's start, epoch ns (a unit without
    one, or whose start is after its last step, is timed from its first step)."""
    if not requests.has_steps:
        return {}
    con = requests.con
    keys = [key.rsplit("/", 2) for key in unit_starts]
    con.register(
        "timeline_unit_starts",
        pa.table(
            {
                "arm": pa.array([k[0] for k in keys], pa.string()),
                "shape": pa.array([k[1] for k in keys], pa.string()),
                "repeat": pa.array([int(k[2].removeprefix("r")) for k in keys], pa.int32()),
                "start_ns": pa.array(list(unit_starts.values()), pa.int64()),
            }
        ),
    )
    con.execute(f"CREATE OR REPLACE TEMP TABLE timeline_units AS {_SHAPE_SQL}")
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE timeline_units_b AS
        SELECT *, least({max_points}, greatest(1, drawn // engines)) AS buckets,
               (drawn > {max_points} OR engines > 1) AS bucketed,
               (first_ns - origin) / 1e9 AS t0, (last_ns - origin) / 1e9 AS t1
        FROM timeline_units
        """
    )
    # Raw steps of the small single-engine units; equal-time buckets over [t0, t1] of the others.
    points = con.sql(
        """
        SELECT u.arm, u.shape, u.repeat, (s.start_ns - u.origin) / 1e9 AS t, s.k::DOUBLE AS k,
               s.batch_size::DOUBLE AS batch
        FROM timeline_units_b u JOIN steps s USING (arm, shape, repeat)
        WHERE NOT u.bucketed AND s.start_ns >= u.origin AND s.k IS NOT NULL
        UNION ALL
        SELECT arm, shape, repeat, t0 + bucket * (t1 - t0) / buckets AS t, avg(k) AS k, max(batch) AS batch
        FROM (
            SELECT u.arm, u.shape, u.repeat, u.t0, u.t1, u.buckets, s.k::DOUBLE AS k, s.batch_size::DOUBLE AS batch,
                   CASE WHEN u.t1 > u.t0
                        THEN least(greatest(floor(((s.start_ns - u.origin) / 1e9 - u.t0)
                                                  / ((u.t1 - u.t0) / u.buckets)), 0), u.buckets - 1)
                        ELSE 0 END AS bucket
            FROM timeline_units_b u JOIN steps s USING (arm, shape, repeat)
            WHERE u.bucketed AND s.start_ns >= u.origin AND s.k IS NOT NULL
        ) GROUP BY arm, shape, repeat, t0, t1, buckets, bucket
        ORDER BY arm, shape, repeat, t
        """
    ).to_arrow_table()
    units = con.execute(
        "SELECT arm, shape, repeat, steps, engines, origin, last_end, inside, bucketed FROM timeline_units_b "
        "ORDER BY arm, shape, repeat"
    ).fetchall()
    out: dict[str, TimelineSeries] = {}
    arm_col = np.asarray(points["arm"].to_pylist(), dtype=object)
    shape_col = np.asarray(points["shape"].to_pylist(), dtype=object)
    repeat_col = points["repeat"].to_numpy()
    t_col = points["t"].to_numpy(zero_copy_only=False)
    k_col = points["k"].to_numpy(zero_copy_only=False)
    batch_col = points["batch"].to_numpy(zero_copy_only=False)
    for arm, shape, repeat, steps, engines, origin, last_end, inside, bucketed in units:
        mine = (arm_col == arm) & (shape_col == shape) & (repeat_col == repeat)
        t, k, batch = t_col[mine], k_col[mine], batch_col[mine]
        if not len(t):  # no step with a k after the unit's start: one point at the origin keeps the axes
            t, k, batch = np.zeros(1), np.zeros(1), np.zeros(1)
        end = (int(last_end) - int(origin)) / 1e9
        out[f"{arm}/{shape}/r{repeat}"] = TimelineSeries(
            t=t,
            k=k,
            batch=batch,
            end=max(end, float(t[-1])),
            steps=int(steps),
            engines=int(engines),
            bucketed=bool(bucketed),
            early=int(steps) - int(inside),
        )
    return out


def series_of_table(
    steps: pa.Table, unit_starts: Mapping[str, int], *, max_points: int = MAX_POINTS
) -> dict[str, TimelineSeries]:
    """timeline_series over a step table in memory (arm, shape, repeat, engine_id, start_ns, end_ns, batch_size,
    k): report.html of a table in hand, tools and tests."""
    requests = Requests(con=connect(), arms=(), has_steps=steps.num_rows > 0, step_arms=frozenset())
    try:
        requests.con.register("steps", steps)
        return timeline_series(requests, unit_starts, max_points=max_points)
    finally:
        requests.close()
