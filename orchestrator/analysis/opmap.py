"""The operating map: for every load band and arm, what users got, and whether the arm beat the baseline.

DuckDB computes every per-request quantity and groups it: per (band, arm, category) the counts and sums, per
(band, arm, time block) the bootstrap's totals, per (band, arm) the exact quantiles, and the paired totals by
a join of each arm's requests to the baseline's on (shape, repeat, request_index). All band sets go through one
scan with GROUPING SETS. numpy then only sees these small aggregates: bootstrap, intervals, verdicts, crossover.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadshapes.slo import SloConfig
from orchestrator.analysis.arms import ArmInfo, baselines_of
from orchestrator.analysis.bands import BandSet
from orchestrator.analysis.results import Crossover, MapCell, MapSettings, OperatingMap, Quantiles, Verdict
from orchestrator.analysis.slo import met_sql
from orchestrator.analysis.source import CLOCK_SQL, Requests
from orchestrator.analysis.speedup import CLOCK, PAIR_COLUMNS, CellBlocks, speedup

QUANTILES = (0.5, 0.9, 0.99)
NO_CATEGORY = "(none)"
_CELL_SUMS = ("ok", "met", "clock_s", "steps", "k_sum", "spec_steps", "accepted", "own_band")
_BLOCK_SUMS = ("log_tpot", "usable", "met", "clock_s")  # speedup's LOG_TPOT, TPOT_USABLE, MET, CLOCK


def _float(value: float | None) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def _quantiles(values: Sequence[float | None] | None) -> Quantiles:
    p50, p90, p99 = values if values is not None else (None, None, None)
    return Quantiles(p50=_float(p50), p90=_float(p90), p99=_float(p99))


def _ratio(numerator: float, denominator: float) -> float | None:
    return float(numerator / denominator) if denominator > 0 else None


def scored_sql(slos: SloConfig, band_sets: Sequence[BandSet], blocks: int) -> str:
    """Per request: the map's measures, its time block within its run (the bootstrap resamples blocks, as
    requests close in time share queue state) and its band in each band set (band_0, band_1, ...)."""
    measures = {"batch_size": "band_batch", "offered_rate": "offered_rate"}
    bands = ", ".join(f"{b.sql(measures[b.measure])} AS band_{j}" for j, b in enumerate(band_sets))
    return f"""
    SELECT arm, shape, run, repeat, request_index, category, ok, ttft, tpot, e2e, queue_wait,
           steps, k_sum, spec_steps, accepted, own_band,
           {met_sql(slos)} AS met,
           coalesce(ok AND tpot > 0, false) AS usable,
           CASE WHEN ok AND tpot > 0 THEN ln(tpot) ELSE 0.0 END AS log_tpot,
           {CLOCK_SQL} AS clock_s,
           CASE WHEN span_s > 0 THEN least(CAST(trunc(offset_s * ({blocks} / span_s)) AS BIGINT), {blocks - 1})
                ELSE abs(request_index) % {blocks} END AS block,
           {bands}
    FROM banded
    """


def banded_sql() -> str:
    """Each request with the batch it is banded by: its baseline twin's typical batch (the same request in the
    `off` arm it is compared with), so a band holds the same requests in every arm, whichever arm is faster.
    A request without a twin is banded by its own batch (own_band). The twins come from `baseline_twins`, the
    baselines' (shape, repeat, request_index, typical batch): a narrow table, so the trace is read once."""
    return """
    SELECT r.*, coalesce(t.typical_batch, r.typical_batch) AS band_batch, (t.baseline IS NULL) AS own_band
    FROM requests r
    LEFT JOIN arm_baselines m ON r.arm = m.arm
    LEFT JOIN baseline_twins t ON t.baseline = m.baseline AND t.shape = r.shape AND t.repeat = r.repeat
         AND t.request_index = r.request_index AND r.request_index >= 0
    """


TWINS_SQL = """
CREATE OR REPLACE TEMP TABLE baseline_twins AS
SELECT arm AS baseline, shape, repeat, request_index, typical_batch FROM requests
WHERE arm IN (SELECT baseline FROM arm_baselines) AND request_index >= 0
"""


def _which_set(count: int) -> str:
    """In a GROUPING SETS result, the index of the band set the row was grouped by."""
    cases = " ".join(f"WHEN grouping(band_{j}) = 0 THEN {j}" for j in range(count))
    return f"CASE {cases} END"


def _band(count: int) -> str:
    return f"coalesce({', '.join(f'band_{j}' for j in range(count))})"


@dataclass(frozen=True)
class _CellAggregates:
    """One band set's aggregates, keyed by (band, arm)."""

    sums: dict[tuple[int, str], np.ndarray]  # _CELL_SUMS, over every category
    requests: dict[tuple[int, str], int]
    by_category: dict[tuple[int, str], dict[str, tuple[float, float]]]  # category -> (spec steps, accepted)
    blocks: dict[tuple[int, str], tuple[np.ndarray, int]]  # (non-empty blocks, _BLOCK_SUMS) totals, requests
    pairs: dict[tuple[int, str], tuple[np.ndarray, int]]  # (blocks, PAIR_COLUMNS) totals, pairs
    quantiles: dict[tuple[int, str], list[list[float | None] | None]]  # ttft, tpot, e2e, queue wait
    unbanded: dict[str, int]


def _aggregates(
    requests: Requests, slos: SloConfig, band_sets: Sequence[BandSet], settings: MapSettings, baselines: dict[str, str]
) -> list[_CellAggregates]:
    """`baselines`: arm -> the baseline arm it is compared with (a baseline names itself), arms with data only."""
    con, n = requests.con, len(band_sets)
    con.execute("CREATE OR REPLACE TEMP TABLE arm_baselines (arm VARCHAR, baseline VARCHAR)")
    if baselines:
        con.executemany("INSERT INTO arm_baselines VALUES (?, ?)", sorted(baselines.items()))
    con.execute(TWINS_SQL)
    con.execute(f"CREATE OR REPLACE TEMP VIEW banded AS {banded_sql()}")
    # Computed once from one read of the trace (the baseline-twin join, SLOs, bands, blocks): the cells, every
    # quantile and the pairing read it again, and re-evaluating the view each time cost 4-5x the scan. In a
    # compressed in-memory database: a temporary table is kept uncompressed (~180 bytes a request), so at 10 M
    # rows it spilled past the memory limit and every later query read it back; compressed it is ~3x smaller
    # (bench-report, 10 M rows: maps 25 s of CPU instead of 31 s; the same at 1 M rows).
    con.execute("ATTACH IF NOT EXISTS ':memory:' AS packed (COMPRESS)")
    con.execute(f"CREATE OR REPLACE TABLE packed.scored AS {scored_sql(slos, band_sets, settings.blocks)}")
    con.execute("CHECKPOINT packed")  # compression happens at the checkpoint
    con.execute("CREATE OR REPLACE TEMP VIEW scored AS SELECT * FROM packed.scored")
    band_keys = [f"band_{j}" for j in range(n)]
    out = [
        _CellAggregates(sums={}, requests={}, by_category={}, blocks={}, pairs={}, quantiles={}, unbanded={})
        for _ in band_sets
    ]
    sums = ", ".join(f"sum({c}::DOUBLE)" for c in _CELL_SUMS)
    by_cell_category = ", ".join(f"({k}, arm, category)" for k in band_keys)
    by_block = ", ".join(f"({k}, arm, shape, run, repeat, block)" for k in band_keys)
    # One scan for the cells (by category) and the bootstrap blocks of every band set.
    rows = con.execute(
        f"""
        SELECT {_which_set(n)} AS m, {_band(n)} AS band, arm, category, shape, run, repeat, block,
               grouping(category) AS by_block, count(*) AS n, {sums},
               sum(log_tpot), sum(usable::DOUBLE), sum(met::DOUBLE), sum(clock_s)
        FROM scored GROUP BY GROUPING SETS ({by_cell_category}, {by_block})
        ORDER BY m, band, arm, shape, run, repeat, block
        """
    ).fetchall()
    block_rows: dict[tuple[int, int, str], list[tuple[list[float], int]]] = {}
    for m, band, arm, category, _shape, _run, _repeat, _block, by_block, count, *values in rows:
        agg = out[m]
        if band < 0:
            if not by_block:
                agg.unbanded[arm] = agg.unbanded.get(arm, 0) + int(count)
            continue
        key = (int(band), str(arm))
        if by_block:
            block_rows.setdefault((m, *key), []).append(([float(v) for v in values[len(_CELL_SUMS) :]], int(count)))
            continue
        cell_values = np.array(values[: len(_CELL_SUMS)], dtype=np.float64)
        agg.sums[key] = agg.sums.get(key, np.zeros(len(_CELL_SUMS))) + cell_values
        agg.requests[key] = agg.requests.get(key, 0) + int(count)
        spec, accepted = cell_values[_CELL_SUMS.index("spec_steps")], cell_values[_CELL_SUMS.index("accepted")]
        agg.by_category.setdefault(key, {})[NO_CATEGORY if category is None else str(category)] = (spec, accepted)
    for (m, band, arm), found in block_rows.items():
        totals = np.array([values for values, _ in found], dtype=np.float64).reshape(-1, len(_BLOCK_SUMS))
        out[m].blocks[(band, arm)] = (totals, sum(c for _, c in found))
    _quantile_aggregates(requests, out, band_keys)
    if any(arm != base for arm, base in baselines.items()):
        _pair_aggregates(requests, out)
    return out


def _quantile_aggregates(requests: Requests, out: list[_CellAggregates], band_keys: list[str]) -> None:
    """DuckDB's exact quantile_cont (numpy's linear percentile) of the completed requests' latencies, and of
    every request's queue wait. One query per band set and measure: an exact quantile holds its group's values
    in memory (DuckDB cannot spill it), so they take turns and at most one column of the trace is held."""
    q = list(QUANTILES)
    measures = (("ttft", "ok"), ("tpot", "ok"), ("e2e", "ok"), ("queue_wait", "true"))
    for m, key in enumerate(band_keys):
        for position, (measure, where) in enumerate(measures):
            rows = requests.con.execute(
                f"SELECT {key}, arm, quantile_cont({measure}, {q}) FROM scored "
                f"WHERE {key} >= 0 AND {where} AND {measure} IS NOT NULL GROUP BY ALL"
            ).fetchall()
            for band, arm, values in rows:
                cell = out[m].quantiles.setdefault((int(band), str(arm)), [None] * len(measures))
                cell[position] = values


def _pair_aggregates(requests: Requests, out: list[_CellAggregates]) -> None:
    """Each arm's requests joined to its baseline's copy of the same request (shape, repeat, request_index),
    once for every band set; a pair counts in a band set's map when both copies are in the same band there:
    per (cell, block of the arm's request), the paired totals."""
    n = len(out)
    same = ", ".join(f"a.band_{j} = b.band_{j}" for j in range(n))
    bands = ", ".join(f"a.band_{j}" for j in range(n))
    rows = requests.con.execute(
        f"""
        WITH pairs AS (
            SELECT [{same}] AS same, [{bands}] AS bands, a.arm, a.shape, a.run, a.repeat, a.block,
                   CASE WHEN a.usable AND b.usable THEN b.log_tpot - a.log_tpot ELSE 0.0 END AS log_ratio,
                   (a.usable AND b.usable)::DOUBLE AS both_usable, a.met::DOUBLE AS met_a, b.met::DOUBLE AS met_b,
                   a.clock_s AS clock_a, b.clock_s AS clock_b
            FROM scored a JOIN arm_baselines m ON a.arm = m.arm AND m.baseline <> a.arm
            JOIN scored b ON b.arm = m.baseline AND a.shape = b.shape AND a.repeat = b.repeat
                 AND a.request_index = b.request_index
            WHERE a.request_index >= 0
        )
        SELECT m, bands[m + 1] AS band, arm, shape, run, repeat, block, count(*),
               sum(log_ratio), sum(both_usable), sum(met_a), sum(met_b), sum(clock_a), sum(clock_b)
        FROM pairs, range({n}) AS sets(m)
        WHERE same[m + 1] AND bands[m + 1] >= 0
        GROUP BY ALL ORDER BY 1, 2, 3, 4, 5, 6, 7
        """
    ).fetchall()
    found: dict[tuple[int, int, str], list[tuple[list[float], int]]] = {}
    for m, band, arm, _shape, _run, _repeat, _block, count, *values in rows:
        found.setdefault((int(m), int(band), str(arm)), []).append(([float(v) for v in values], int(count)))
    for (m, band, arm), blocks in found.items():
        totals = np.array([v for v, _ in blocks], dtype=np.float64).reshape(-1, PAIR_COLUMNS)
        out[m].pairs[(band, arm)] = (totals, sum(c for _, c in blocks))


def crossover(arm: str, verdicts: Sequence[tuple[str, int, Verdict]]) -> Crossover:
    """The lowest band where the verdict stops being 'helps'; bands without enough data are skipped."""
    judged = [(label, i, v) for label, i, v in verdicts if v is not Verdict.INSUFFICIENT_DATA]
    if not judged:
        return Crossover(arm=arm, band=None, band_index=None, message=f"{arm}: no band with enough data")
    for position, (label, i, v) in enumerate(judged):
        if v is not Verdict.HELPS:
            said = v.value.replace("_", " ")
            if position == 0:
                message = f"{arm}: does not help even at the lowest load ({label}: {said})"
            else:
                message = f"{arm}: helps up to {judged[position - 1][0]}, stops at {label} ({said})"
            return Crossover(arm=arm, band=label, band_index=i, message=message)
    return Crossover(arm=arm, band=None, band_index=None, message=f"{arm}: helps in every band with data")


def _blocks(found: tuple[np.ndarray, int] | None, columns: int) -> CellBlocks:
    if found is None:
        return CellBlocks(totals=np.zeros((0, columns)), rows=0)
    return CellBlocks(totals=found[0], rows=found[1])


def _one_map(
    agg: _CellAggregates,
    arms: Sequence[ArmInfo],
    present: set[str],
    bases: dict[str, ArmInfo | None],
    bands: BandSet,
    settings: MapSettings,
) -> OperatingMap:
    ok, met, clock, steps, k_sum, spec_steps, accepted, own_band = range(len(_CELL_SUMS))
    cells: list[MapCell] = []
    verdicts: dict[str, list[tuple[str, int, Verdict]]] = {a.name: [] for a in arms if not a.baseline}
    for b, spec_band in enumerate(bands.bands):
        for arm_position, arm in enumerate(arms):
            if arm.name not in present:
                continue
            key = (b, arm.name)
            cell_speedup = None
            base = bases.get(arm.name)
            if not arm.baseline:
                cell_speedup = speedup(
                    arm=_blocks(agg.blocks.get(key), CLOCK + 1),
                    base=_blocks(agg.blocks.get((b, base.name)) if base else None, CLOCK + 1),
                    pairs=_blocks(agg.pairs.get(key), PAIR_COLUMNS),
                    baseline=base.name if base else (arm.compared_with or "(none)"),
                    settings=settings,
                    rng=np.random.default_rng([settings.seed, b, arm_position]),
                    engines_ratio=arm.engines_ratio,
                )
                verdicts[arm.name].append((spec_band.label, b, cell_speedup.verdict))
            t = agg.sums.get(key, np.zeros(len(_CELL_SUMS)))
            n = agg.requests.get(key, 0)
            quantiles = agg.quantiles.get(key) or [None] * 4
            cells.append(
                MapCell(
                    band=spec_band.label,
                    band_index=b,
                    arm=arm.name,
                    requests=n,
                    completed=round(t[ok]),
                    error_rate=_ratio(n - t[ok], n),
                    clock_s=float(t[clock]),
                    throughput_rps=_ratio(t[ok], t[clock]),
                    goodput_rps=_ratio(t[met], t[clock]),
                    goodput_fraction=_ratio(t[met], n),
                    ttft_s=_quantiles(quantiles[0]),
                    tpot_s=_quantiles(quantiles[1]),
                    e2e_s=_quantiles(quantiles[2]),
                    queue_wait_s=_quantiles(quantiles[3]),
                    steps=round(t[steps]),
                    mean_executed_k=_ratio(t[k_sum], t[steps]),
                    acceptance_length=None if t[spec_steps] == 0 else float(1 + t[accepted] / t[spec_steps]),
                    acceptance_length_by_category={
                        name: float(1 + drafts_accepted / spec)
                        for name, (spec, drafts_accepted) in sorted(
                            agg.by_category.get(key, {}).items(), key=lambda kv: (kv[0] != NO_CATEGORY, kv[0])
                        )
                        if spec > 0
                    },
                    speedup=cell_speedup,
                    own_batch_band=round(t[own_band]) if bands.measure == "batch_size" else 0,
                )
            )
    return OperatingMap(
        measure=bands.measure,
        unit=bands.unit,
        bands=list(bands.bands),
        baseline=next((a.name for a in arms if a.baseline and a.name in present), ""),
        baselines={name: base.name for name, base in bases.items() if base is not None and name in present},
        arms=[a.name for a in arms if a.name in present],
        cells=cells,
        crossovers=[crossover(name, v) for name, v in verdicts.items()],
        unbanded={name: agg.unbanded.get(name, 0) for name in sorted(present)},
        settings=settings,
    )


def operating_maps(
    requests: Requests,
    arms: Sequence[ArmInfo],
    slos: SloConfig,
    band_sets: Sequence[BandSet],
    *,
    settings: MapSettings | None = None,
) -> list[OperatingMap]:
    """One map per band set, from one set of aggregates."""
    chosen = settings or MapSettings()
    unknown = sorted(set(requests.arms) - {a.name for a in arms})
    if unknown:
        raise ValueError(f"trace has arms with no ArmInfo: {', '.join(unknown)}")
    present = set(requests.arms)
    bases = baselines_of([a for a in arms if a.name in present or a.baseline])
    bases = {name: base if base is not None and base.name in present else None for name, base in bases.items()}
    pairing = {name: base.name for name, base in bases.items() if base is not None and name in present}
    aggregates = _aggregates(requests, slos, band_sets, chosen, pairing)
    return [_one_map(agg, arms, present, bases, b, chosen) for agg, b in zip(aggregates, band_sets, strict=True)]


def operating_map(
    requests: Requests,
    arms: Sequence[ArmInfo],
    slos: SloConfig,
    bands: BandSet,
    *,
    settings: MapSettings | None = None,
) -> OperatingMap:
    return operating_maps(requests, arms, slos, [bands], settings=settings)[0]
