"""Two runs of one campaign's arms, cell by cell: per band and arm, what the candidate run's requests got against
the baseline run's, with the map's own ratios (speedup.speedup: per-token latency as a ratio of geometric means,
goodput per second of clock) and the map's block bootstrap.

Each run is read as the report reads it (run_views.run_requests) and mapped on the same band sets (the baseline
run's), which leaves its `scored` view: one row per request with its band in each set. Where the two runs sent
the same traffic (`paired`), the baseline's requests are written once to a Parquet file beside the candidate's
connection and joined to their twins by (arm, shape, repeat, request_index): a pair counts in the baseline
copy's band, so a band holds the same requests in both runs whichever run is faster. Elsewhere the cells are
compared side against side, each run's blocks resampled on their own (speedup's between_runs). ratio > 1
favours the candidate.

Side against side, a run's blocks are stretches of DEPENDENCE_LIFETIMES median request lifetimes (e2e) of its
unit, not the map's 1/200 of its clock: requests that share the engine while they run share its state (batch,
queue), so two runs of other requests differ by more than the requests within one run do. On 41 seeds of
tests/orchestrator/compare's campaign the `off` arm's per-token latency at 19-22 req/s varied 3.1x as much
between runs as the map's blocks said, its goodput at batch 9-20 2.0x (where a batch band ends is one draw per
run); the residual log tpot of requests stays correlated for about two median lifetimes (0.57 at 0.24 s apart,
0.11 at 0.72 s, 0.02 at 0.96 s; median e2e 0.38 s). A band a few seconds long then holds a handful of stretches,
hence speedup's between_runs interval (Welch's t). On 135 pairs of those seeds, cells falsely better went from
3.7% to 0.8% and falsely worse from 6.5% to 1.2% (of 3192).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from orchestrator.analysis.opmap.bands import BandSet
from orchestrator.analysis.opmap.operating_map import operating_maps
from orchestrator.analysis.opmap.results import MapSettings, OperatingMap, Speedup
from orchestrator.analysis.opmap.speedup import CLOCK, PAIR_COLUMNS, CellBlocks, speedup
from orchestrator.analysis.read.db import EngineSettings, sql_string
from orchestrator.analysis.read.inputs import RunInputs
from orchestrator.analysis.read.views import run_requests

Cell = tuple[int, int, str]  # band set, band, arm
DEPENDENCE_LIFETIMES = 2  # a side's block: this many median request lifetimes of its unit (see above)


@dataclass(frozen=True)
class RunPair:
    """Both runs' maps on the baseline's band sets, and per (band set, band, common arm) the candidate against the
    baseline (Speedup: its `baseline` names the baseline run's arm; verdict helps = better)."""

    baseline_maps: list[OperatingMap]
    candidate_maps: list[OperatingMap]
    changes: dict[Cell, Speedup]
    requests: dict[Cell, tuple[int, int]]  # (baseline's, candidate's) requests in the cell


def band_sets_of(maps: Sequence[OperatingMap]) -> list[BandSet]:
    return [BandSet(measure=m.measure, unit=m.unit, bands=tuple(m.bands)) for m in maps]


def _group_blocks(rows: list[tuple[Any, ...]], columns: int) -> dict[tuple[int, str], CellBlocks]:
    """(band, arm, requests, *totals) rows in (run, time block) order: per cell, its block totals."""
    found: dict[tuple[int, str], tuple[list[list[float]], int]] = {}
    for band, arm, count, *values in rows:
        blocks, n = found.get((int(band), str(arm)), ([], 0))
        blocks.append([float(v) for v in values])
        found[(int(band), str(arm))] = (blocks, n + int(count))
    return {
        key: CellBlocks(totals=np.array(blocks, dtype=np.float64).reshape(-1, columns), rows=n)
        for key, (blocks, n) in found.items()
    }


def _order(key: str, run: str) -> str:
    return f"GROUP BY {key}, {run}arm, {run}run_id, {run}block ORDER BY {key}, {run}arm, {run}run_id, {run}block"


def _stretch_blocks(con: duckdb.DuckDBPyConnection) -> None:
    """`stretch` per request: its block side against side, DEPENDENCE_LIFETIMES median lifetimes of its unit
    long (the map's block where the unit has no finished request to time)."""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE lifetimes AS
        SELECT run_id, {DEPENDENCE_LIFETIMES} * median(e2e) FILTER (WHERE ok AND e2e > 0) AS stretch_s
        FROM scored GROUP BY run_id
        """
    )
    con.execute(
        "CREATE OR REPLACE TEMP VIEW stretched AS SELECT s.*, CASE WHEN l.stretch_s > 0 AND s.offset_s IS NOT NULL "
        "THEN CAST(floor(s.offset_s / l.stretch_s) AS BIGINT) ELSE s.block END AS stretch "
        "FROM scored s LEFT JOIN lifetimes l USING (run_id)"
    )


def _side_blocks(
    con: duckdb.DuckDBPyConnection, band_set: int, arms: Sequence[str]
) -> dict[tuple[int, str], CellBlocks]:
    """A run's own blocks (its stretches) in speedup's LOG_TPOT, TPOT_USABLE, MET, CLOCK layout, from the map's
    `scored` view."""
    key = f"band_{band_set}"
    listed = ", ".join(sql_string(a) for a in arms) or "NULL"
    rows = con.execute(
        f"""
        SELECT {key}, arm, count(*), sum(log_tpot), count(*) FILTER (WHERE usable),
               count(*) FILTER (WHERE coalesce(met, false)), sum(clock_s)
        FROM stretched WHERE {key} >= 0 AND arm IN ({listed})
        GROUP BY {key}, arm, run_id, stretch ORDER BY {key}, arm, run_id, stretch
        """
    ).fetchall()
    return _group_blocks(rows, CLOCK + 1)


def _export_twins(con: duckdb.DuckDBPyConnection, band_sets: int, arms: Sequence[str], path: str) -> None:
    """The baseline run's requests, narrow, to a Parquet file the candidate's connection joins (DuckDB streams
    it: nothing of it is held in Python)."""
    bands = ", ".join(f"band_{j}" for j in range(band_sets))
    listed = ", ".join(sql_string(a) for a in arms) or "NULL"
    con.execute(
        f"COPY (SELECT arm, shape, repeat, request_index, {bands}, usable, log_tpot, coalesce(met, false) AS met, "
        f"clock_s FROM scored WHERE request_index >= 0 AND arm IN ({listed})) TO {sql_string(path)} (FORMAT PARQUET)"
    )


def _pair_blocks(con: duckdb.DuckDBPyConnection, band_set: int, path: str) -> dict[tuple[int, str], CellBlocks]:
    """Candidate requests joined to their baseline twins, in the baseline's band: speedup's PAIR_COLUMNS (log tpot
    difference baseline - candidate, both usable, met candidate, met baseline, clock candidate, clock baseline)."""
    key = f"b.band_{band_set}"
    both = "b.usable AND c.usable"
    rows = con.execute(
        f"""
        SELECT {key}, c.arm, count(*), coalesce(sum(b.log_tpot - c.log_tpot) FILTER (WHERE {both}), 0.0),
               count(*) FILTER (WHERE {both}), count(*) FILTER (WHERE coalesce(c.met, false)),
               count(*) FILTER (WHERE b.met), sum(c.clock_s), sum(b.clock_s)
        FROM scored c JOIN read_parquet({sql_string(path)}) b
             ON c.arm = b.arm AND c.shape = b.shape AND c.repeat = b.repeat AND c.request_index = b.request_index
        WHERE {key} >= 0 {_order(key, "c.")}
        """
    ).fetchall()
    return _group_blocks(rows, PAIR_COLUMNS)


def _requests_of(maps: Sequence[OperatingMap]) -> dict[tuple[int, int, str], int]:
    return {(j, c.band_index, c.arm): c.requests for j, m in enumerate(maps) for c in m.cells}


def compare_runs(
    baseline: RunInputs,
    candidate: RunInputs,
    band_sets: Sequence[BandSet],
    arms: Sequence[str],
    *,
    paired: bool,
    settings: MapSettings,
    engine: EngineSettings | None = None,
) -> RunPair:
    """`arms`: the arms both runs ran (in the baseline's order); `paired`: the runs sent the same traffic."""
    spill = tempfile.mkdtemp(prefix="specdrill-compare-")
    twins = os.path.join(spill, "baseline-requests.parquet")
    try:
        sides: list[list[dict[tuple[int, str], CellBlocks]]] = []
        maps: list[list[OperatingMap]] = []
        pairs: list[dict[tuple[int, str], CellBlocks]] = [{} for _ in band_sets]
        for position, inputs in enumerate((baseline, candidate)):
            units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units]
            requests = run_requests(inputs.store.root, units, settings=engine or EngineSettings.from_env())
            try:
                try:
                    # Each run's own baselines and settings: its cells as its report shows them, on common bands.
                    found = operating_maps(requests, inputs.arms, inputs.campaign.slo, band_sets)
                    maps.append(found)
                    _stretch_blocks(requests.con)
                    sides.append([_side_blocks(requests.con, j, arms) for j in range(len(band_sets))])
                    if paired and position == 0:
                        _export_twins(requests.con, len(band_sets), arms, twins)
                    elif paired:
                        pairs = [_pair_blocks(requests.con, j, twins) for j in range(len(band_sets))]
                except duckdb.Error as exc:  # a file found corrupt mid-scan: one line naming it
                    raise requests.blame(exc) from None
            finally:
                requests.close()
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    base_n, cand_n = _requests_of(maps[0]), _requests_of(maps[1])
    changes: dict[Cell, Speedup] = {}
    counts: dict[Cell, tuple[int, int]] = {}
    empty = CellBlocks(totals=np.zeros((0, CLOCK + 1)), rows=0)
    no_pairs = CellBlocks(totals=np.zeros((0, PAIR_COLUMNS)), rows=0)
    for j, bands in enumerate(band_sets):
        for b in range(len(bands.bands)):
            for position, arm in enumerate(arms):
                cell = (j, b, arm)
                counts[cell] = (base_n.get(cell, 0), cand_n.get(cell, 0))
                changes[cell] = speedup(
                    arm=sides[1][j].get((b, arm), empty),
                    base=sides[0][j].get((b, arm), empty),
                    pairs=pairs[j].get((b, arm), no_pairs),
                    baseline=f"{arm} in the baseline run",
                    settings=settings,
                    rng=np.random.default_rng([settings.seed, j, b, position]),
                    between_runs=True,
                )
    return RunPair(baseline_maps=maps[0], candidate_maps=maps[1], changes=changes, requests=counts)
