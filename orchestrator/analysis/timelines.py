"""The engine step timelines as the report draws them: per unit, executed k and batch size over time, at most
`max_points` points (equal-time buckets: mean k, max batch size) once a unit has more steps than that or more
than one engine.

DuckDB buckets the steps where they lie, so a day of steps never becomes one table in memory; `series_of_steps`
makes the same buckets in numpy from a step table already in memory (tests, small runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.analysis.source import Requests

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


_UNITS_SQL = """
SELECT s.arm, s.shape, s.repeat, count(*) AS steps, count(DISTINCT s.engine_id) AS engines,
       CASE WHEN u.start_ns IS NULL OR u.start_ns > max(s.start_ns) THEN min(s.start_ns) ELSE u.start_ns END
           AS origin,
       max(s.end_ns) AS last_end
FROM steps s LEFT JOIN timeline_unit_starts u USING (arm, shape, repeat)
GROUP BY s.arm, s.shape, s.repeat, u.start_ns
"""

_SHAPE_SQL = f"""
SELECT u.arm, u.shape, u.repeat, u.steps, u.engines, u.origin, u.last_end,
       count(*) AS inside, min(s.start_ns) AS first_ns, max(s.start_ns) AS last_ns
FROM ({_UNITS_SQL}) u JOIN steps s USING (arm, shape, repeat)
WHERE s.start_ns >= u.origin
GROUP BY ALL
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
        SELECT *, least({max_points}, greatest(1, inside // engines)) AS buckets,
               (inside > {max_points} OR engines > 1) AS bucketed,
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
        WHERE NOT u.bucketed AND s.start_ns >= u.origin
        UNION ALL
        SELECT arm, shape, repeat, t0 + bucket * (t1 - t0) / buckets AS t, avg(k) AS k, max(batch) AS batch
        FROM (
            SELECT u.arm, u.shape, u.repeat, u.t0, u.t1, u.buckets, s.k::DOUBLE AS k, s.batch_size::DOUBLE AS batch,
                   CASE WHEN u.t1 > u.t0
                        THEN least(greatest(floor(((s.start_ns - u.origin) / 1e9 - u.t0)
                                                  / ((u.t1 - u.t0) / u.buckets)), 0), u.buckets - 1)
                        ELSE 0 END AS bucket
            FROM timeline_units_b u JOIN steps s USING (arm, shape, repeat)
            WHERE u.bucketed AND s.start_ns >= u.origin
        ) GROUP BY arm, shape, repeat, t0, t1, buckets, bucket
        ORDER BY arm, shape, repeat, t
        """
    ).to_arrow_table()
    units = con.execute(
        "SELECT arm, shape, repeat, steps, engines, origin, last_end, inside, bucketed FROM timeline_units_b"
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
        t = t_col[mine]
        end = (int(last_end) - int(origin)) / 1e9
        out[f"{arm}/{shape}/r{repeat}"] = TimelineSeries(
            t=t,
            k=k_col[mine],
            batch=batch_col[mine],
            end=max(end, float(t[-1])) if len(t) else end,
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
    k): for tools and tests."""
    from orchestrator.analysis.db import connect

    con = connect()
    try:
        con.register("steps", steps)
        requests = Requests(con=con, arms=(), has_steps=steps.num_rows > 0, step_arms=frozenset())
        return timeline_series(requests, unit_starts, max_points=max_points)
    finally:
        con.close()


def series_of_steps(
    steps: pa.Table, unit_starts: Mapping[str, int], *, max_points: int = MAX_POINTS
) -> dict[str, TimelineSeries]:
    """timeline_series of a step table in memory, in numpy. Unlike the DuckDB path, a step whose k is null (vLLM
    reports none for a step whose drafts no request verified) is left out of the points instead of drawn as NaN."""
    keys = steps.group_by(["arm", "shape", "repeat"]).aggregate([]).to_pylist()
    out: dict[str, TimelineSeries] = {}
    for arm, shape, repeat in sorted((str(k["arm"]), str(k["shape"]), int(k["repeat"])) for k in keys):
        unit = f"{arm}/{shape}/r{repeat}"
        out[unit] = _unit_series(_unit_rows(steps, arm, shape, repeat), unit_starts.get(unit), max_points)
    return out


def _unit_rows(steps: pa.Table, arm: str, shape: str, repeat: int) -> pa.Table:
    mask = pc.and_(
        pc.and_(pc.equal(steps["arm"], arm), pc.equal(steps["shape"], shape)), pc.equal(steps["repeat"], repeat)
    )
    return steps.filter(mask)


def _bucket(t: np.ndarray, k: np.ndarray, batch: np.ndarray, buckets: int) -> tuple[np.ndarray, ...]:
    """Equal-time buckets over sorted t: (bucket start, mean k, max batch) for each non-empty bucket."""
    edges = np.linspace(t[0], t[-1], buckets + 1)
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, buckets - 1)
    starts = np.flatnonzero(np.diff(index, prepend=-1))
    counts = np.diff(np.append(starts, len(t)))
    return edges[index[starts]], np.add.reduceat(k, starts) / counts, np.maximum.reduceat(batch, starts)


def _unit_series(rows: pa.Table, start_ns: int | None, max_points: int) -> TimelineSeries:
    start = rows["start_ns"].to_numpy().astype(np.int64)
    order = np.argsort(start, kind="stable")
    if start_ns is None or start_ns > int(start.max()):
        start_ns = int(start.min())  # no (usable) unit start: time from the first step
    t = (start[order] - start_ns) / 1e9
    inside = t >= 0  # steps before the unit started (another unit's tail) are left out
    t = t[inside]
    k = rows["k"].to_numpy(zero_copy_only=False).astype(np.float64)[order][inside]
    batch = rows["batch_size"].to_numpy().astype(np.float64)[order][inside]
    known = ~np.isnan(k)
    t, k, batch = t[known], k[known], batch[known]
    if not len(t):
        t, k, batch = np.zeros(1), np.zeros(1), np.zeros(1)
    end = float((int(pc.max(rows["end_ns"]).as_py()) - start_ns) / 1e9)
    engines = len(pc.unique(rows["engine_id"]))
    buckets = min(max_points, max(1, len(t) // engines))
    bucketed = len(t) > max_points or engines > 1
    if bucketed:
        t, k, batch = _bucket(t, k, batch, buckets)
    early = rows.num_rows - int(inside.sum())
    return TimelineSeries(t, k, batch, max(end, float(t[-1])), rows.num_rows, engines, bucketed, early)
