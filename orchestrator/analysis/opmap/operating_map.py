"""The operating map: for every load band and arm, what users got, and whether the arm beat the baseline.

DuckDB computes every per-request quantity and groups it. Each request is joined to its twin, the same request
(shape, repeat, request_index) in the baseline it is compared with, which gives its batch band and the paired
comparison; one GROUP BY then gives, for every band set, per (band, arm, category) the counts and sums, per
(band, arm, time block) the bootstrap's totals and the paired totals; the exact quantiles per (band, arm)
follow. numpy then only sees these small aggregates: bootstrap, intervals, verdicts, crossover.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadshapes.slo import SloConfig
from orchestrator.analysis.opmap.bands import BandSet
from orchestrator.analysis.opmap.measures import MEASURES, QUANTILE_NAMES, QUANTILES
from orchestrator.analysis.opmap.results import Crossover, MapCell, MapSettings, OperatingMap, Quantiles, Verdict
from orchestrator.analysis.opmap.slo import met_sql
from orchestrator.analysis.opmap.speedup import CLOCK, PAIR_COLUMNS, CellBlocks, speedup
from orchestrator.analysis.read.arms import ArmInfo, baselines_of
from orchestrator.analysis.read.db import sql_list
from orchestrator.analysis.read.source import CLOCK_SQL, Requests
from orchestrator.plan.baselines import primary_baseline

NO_CATEGORY = "(none)"
_CELL_SUMS = ("ok", "met", "clock_s", "steps", "k_sum", "spec_steps", "accepted", "own_band")
_BLOCK_SUMS = ("log_tpot", "usable", "met", "clock_s")  # speedup's LOG_TPOT, TPOT_USABLE, MET, CLOCK


def _float(value: float | None) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def _quantiles(values: Sequence[float | None] | None) -> Quantiles:
    found = values if values is not None else [None] * len(QUANTILE_NAMES)
    return Quantiles(**{name: _float(v) for name, v in zip(QUANTILE_NAMES, found, strict=True)})


def _ratio(numerator: float, denominator: float) -> float | None:
    return float(numerator / denominator) if denominator > 0 else None


def twins_sql(slos: SloConfig, band_sets: Sequence[BandSet], baselines: Sequence[str]) -> str:
    """The baselines' requests as their twins see them, keyed by (baseline_id, twin_unit, twin_index) = (arm_id,
    pair_unit, request_index): their band in each band set (NULL where the value banded by is unknown) and what
    the pairing compares; a request without a planned index (-1) has no twin. Integer keys and a narrow row keep
    the table small; the trace is read once more for the baselines only (their arm is a constant of their
    files' scan, so the others' files are skipped)."""
    value = {"batch_size": "typical_batch", "offered_rate": "offered_rate"}
    bands = ", ".join(
        f"CASE WHEN {value[b.measure]} IS NOT NULL THEN {b.sql(value[b.measure])} END::SMALLINT AS twin_band_{j}"
        for j, b in enumerate(band_sets)
    )
    return f"""
    CREATE OR REPLACE TEMP TABLE baseline_twins AS
    SELECT arm_id AS baseline_id, pair_unit AS twin_unit, request_index AS twin_index, {bands},
           coalesce(ok AND tpot > 0, false) AS twin_usable,
           CASE WHEN ok AND tpot > 0 THEN ln(tpot) ELSE 0.0 END AS twin_log_tpot,
           {met_sql(slos)} AS twin_met, {CLOCK_SQL} AS twin_clock_s
    FROM requests WHERE arm IN {sql_list(baselines)} AND request_index >= 0
    """


def scored_sql(slos: SloConfig, band_sets: Sequence[BandSet], blocks: int) -> str:
    """Per request: the map's measures, its time block within its run (the bootstrap resamples blocks, as
    requests close in time share queue state), its band in each band set (band_j) and, where it has a twin (the
    same request in the `off` arm it is compared with, from `baseline_twins`), what the pairing compares. A
    request is banded by its twin's typical batch, so a band holds the same requests in every arm, whichever
    arm is faster; one without a twin by its own (own_band). pair_j: a pair that counts in band set j (both
    copies in the same band there)."""
    bands = ", ".join(
        (f"coalesce(twin_band_{j}, {b.sql('typical_batch')})" if b.measure == "batch_size" else b.sql("offered_rate"))
        + f" AS band_{j}"
        for j, b in enumerate(band_sets)
    )
    sets = range(len(band_sets))
    pairs = ", ".join(f"paired AND band_{j} >= 0 AND band_{j} = coalesce(twin_band_{j}, -1) AS pair_{j}" for j in sets)
    twin_bands = ", ".join(f"twin_band_{j}" for j in sets)
    return f"""
    SELECT *, {pairs}
    FROM (
        SELECT r.arm, r.arm_id, r.run_id, r.pair_unit, r.shape, r.run, r.repeat, r.request_index, r.category, r.ok,
               r.ttft, r.tpot, r.e2e, r.queue_wait, r.steps, r.k_sum, r.spec_steps, r.accepted, r.offset_s,
               (t.baseline_id IS NULL) AS own_band,
               {met_sql(slos)} AS met,
               coalesce(r.ok AND r.tpot > 0, false) AS usable,
               CASE WHEN r.ok AND r.tpot > 0 THEN ln(r.tpot) ELSE 0.0 END AS log_tpot,
               {CLOCK_SQL} AS clock_s,
               CASE WHEN span_s > 0 THEN least(CAST(trunc(offset_s * ({blocks} / span_s)) AS BIGINT), {blocks - 1})
                    ELSE abs(r.request_index) % {blocks} END AS block,
               {bands}, {twin_bands},
               coalesce(t.baseline_id <> r.arm_id, false) AS paired,
               coalesce(twin_usable AND r.ok AND r.tpot > 0, false) AS both_usable,
               twin_log_tpot, twin_met, twin_clock_s
        FROM requests r
        LEFT JOIN arm_pairing m ON r.arm_id = m.arm_id
        LEFT JOIN baseline_twins t ON t.baseline_id = m.baseline_id AND t.twin_unit = r.pair_unit
             AND t.twin_index = r.request_index
    )
    """


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


# The continuous sums of a group (the yes/no facts are bits of its key, see _flags).
_GROUP_SUMS = ("clock_s", "log_tpot", "steps", "k_sum", "spec_steps", "accepted", "twin_clock_s", "twin_log_tpot")


def _flags(band_sets: int) -> list[str]:
    return ["ok", "met", "usable", "own_band", "both_usable", "twin_met", *(f"pair_{j}" for j in range(band_sets))]


def _has(flag: str, band_sets: int) -> str:
    """SQL: the groups of `map_groups` whose requests have the yes/no fact `flag`."""
    return f"(flags & {1 << _flags(band_sets).index(flag)}) <> 0"


def _blocks_of(rows: list[tuple[Any, ...]], columns: int) -> dict[tuple[int, str], tuple[np.ndarray, int]]:
    """(band, arm, requests, *totals) rows in (run, time block) order: per cell, its (blocks, columns) totals."""
    found: dict[tuple[int, str], list[tuple[list[float], int]]] = {}
    for band, arm, count, *values in rows:
        found.setdefault((int(band), str(arm)), []).append(([float(v) for v in values], int(count)))
    return {
        key: (np.array([v for v, _ in blocks], dtype=np.float64).reshape(-1, columns), sum(c for _, c in blocks))
        for key, blocks in found.items()
    }


def _aggregates(
    requests: Requests, slos: SloConfig, band_sets: Sequence[BandSet], settings: MapSettings, baselines: dict[str, str]
) -> list[_CellAggregates]:
    """`baselines`: arm -> the baseline arm it is compared with (a baseline names itself), arms with data only."""
    con, n = requests.con, len(band_sets)
    con.execute("CREATE OR REPLACE TEMP TABLE arm_baselines (arm VARCHAR, baseline VARCHAR)")
    if baselines:
        con.executemany("INSERT INTO arm_baselines VALUES (?, ?)", sorted(baselines.items()))
    con.execute(
        "CREATE OR REPLACE TEMP TABLE arm_pairing AS SELECT a.arm_id, b.arm_id AS baseline_id FROM arm_baselines m "
        "JOIN (SELECT DISTINCT arm, arm_id FROM runs) a ON a.arm = m.arm "
        "JOIN (SELECT DISTINCT arm, arm_id FROM runs) b ON b.arm = m.baseline"
    )
    con.execute(twins_sql(slos, band_sets, sorted(set(baselines.values()))))
    con.execute(f"CREATE OR REPLACE TEMP VIEW scored AS {scored_sql(slos, band_sets, settings.blocks)}")
    band_keys = [f"band_{j}" for j in range(n)]
    out = [
        _CellAggregates(sums={}, requests={}, by_category={}, blocks={}, pairs={}, quantiles={}, unbanded={})
        for _ in band_sets
    ]
    # One scan, grouped as finely as any table needs (both band sets, arm, category, run, time block) with the
    # request's yes/no facts as bits of one key: a count per group then gives every yes/no total, and the sums
    # are only of the continuous measures. Each band set's cells, bootstrap blocks and paired totals are then
    # sums of these few thousand groups. (One sum per yes/no fact and per band set's pairs, or GROUPING SETS,
    # cost 2-4x the scan at 10 M rows; DuckDB keeps one aggregate state per sum and group.)
    bits = " + ".join(f"{1 << i} * coalesce({flag}, false)::INTEGER" for i, flag in enumerate(_flags(n)))
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE map_groups AS
        SELECT g.*, r.arm
        FROM (
            SELECT {", ".join(band_keys)}, arm_id, category, run_id, block, {bits} AS flags, count(*) AS requests,
                   {", ".join(f"sum({c})::DOUBLE AS {c}" for c in _GROUP_SUMS)}
            FROM scored GROUP BY ALL
        ) g JOIN (SELECT DISTINCT arm_id, arm FROM runs) r USING (arm_id)
        """
    )
    has = {flag: _has(flag, n) for flag in _flags(n)}
    count_if = {flag: f"coalesce(sum(requests) FILTER ({has[flag]}), 0)" for flag in has}
    for m, (agg, key) in enumerate(zip(out, band_keys, strict=True)):
        unbanded = con.execute(f"SELECT arm, sum(requests) FROM map_groups WHERE {key} < 0 GROUP BY arm").fetchall()
        agg.unbanded.update({str(arm): int(count) for arm, count in unbanded})
        cells = con.execute(
            f"""
            SELECT {key}, arm, category, sum(requests), {count_if["ok"]}, {count_if["met"]}, sum(clock_s),
                   sum(steps), sum(k_sum), sum(spec_steps), sum(accepted), {count_if["own_band"]}
            FROM map_groups WHERE {key} >= 0 GROUP BY ALL
            """
        ).fetchall()
        for band, arm, category, count, *values in cells:
            cell = (int(band), str(arm))
            cell_values = np.array(values, dtype=np.float64)  # _CELL_SUMS
            agg.sums[cell] = agg.sums.get(cell, np.zeros(len(_CELL_SUMS))) + cell_values
            agg.requests[cell] = agg.requests.get(cell, 0) + int(count)
            spec, accepted = cell_values[_CELL_SUMS.index("spec_steps")], cell_values[_CELL_SUMS.index("accepted")]
            agg.by_category.setdefault(cell, {})[NO_CATEGORY if category is None else str(category)] = (spec, accepted)
        # The bootstrap's blocks (_BLOCK_SUMS) and the paired totals (PAIR_COLUMNS), in (run, time block) order.
        in_order = f"GROUP BY {key}, arm, run_id, block ORDER BY {key}, arm, run_id, block"
        block_rows = con.execute(
            f"""
            SELECT {key}, arm, sum(requests), sum(log_tpot), {count_if["usable"]}, {count_if["met"]}, sum(clock_s)
            FROM map_groups WHERE {key} >= 0 {in_order}
            """
        ).fetchall()
        agg.blocks.update(_blocks_of(block_rows, len(_BLOCK_SUMS)))
        both = has["both_usable"]
        pair_rows = con.execute(
            f"""
            SELECT {key}, arm, sum(requests), coalesce(sum(twin_log_tpot - log_tpot) FILTER ({both}), 0.0),
                   {count_if["both_usable"]}, {count_if["met"]}, {count_if["twin_met"]}, sum(clock_s),
                   sum(twin_clock_s)
            FROM map_groups WHERE {key} >= 0 AND {has[f"pair_{m}"]} {in_order}
            """
        ).fetchall()
        agg.pairs.update(_blocks_of(pair_rows, PAIR_COLUMNS))
    con.execute("DROP TABLE map_groups")
    _quantile_aggregates(requests, out, band_sets)
    return out


def _quantile_aggregates(requests: Requests, out: list[_CellAggregates], band_sets: Sequence[BandSet]) -> None:
    """DuckDB's exact quantile_cont (numpy's linear percentile) of every measure (opmap/measures.py: the
    completed requests' latencies, every request's queue wait) per band and arm of every band set. An exact
    quantile holds its group's values in memory (DuckDB cannot spill it), so they take turns: one query per arm
    (its files only, as the arm is a constant of their scan) and band set holds that arm's measures once, and no
    copy of the requests is kept in between. Offered-rate bands need no twin, so those queries read the requests
    without the join."""
    con = requests.con
    q = list(QUANTILES)
    measures = ", ".join(
        f"quantile_cont({m.column}, {q})" + (" FILTER (WHERE ok)" if m.completed_only else "") for m in MEASURES
    )
    for arm_id, arm in con.execute("SELECT DISTINCT arm_id, arm FROM runs ORDER BY arm_id").fetchall():
        for m, bands in enumerate(band_sets):
            band, source = (
                (f"band_{m}", "scored") if bands.measure == "batch_size" else (bands.sql("offered_rate"), "requests")
            )
            rows = con.execute(
                f"SELECT {band} AS band, {measures} FROM {source} WHERE arm_id = {int(arm_id)} AND {band} >= 0 "
                "GROUP BY 1"
            ).fetchall()
            for found, *values in rows:
                out[m].quantiles[(int(found), str(arm))] = list(values)


def crossover(arm: str, verdicts: Sequence[tuple[str, int, Verdict]], *, against: str = "") -> Crossover:
    """The lowest band where the verdict stops being 'helps'. Only bands with a verdict count (a thin band, whose
    verdict is insufficient data, is skipped, never read as the arm failing there). `against`: how the arm was
    compared, said after the arm where it is not the plain same-hardware comparison (e.g. per engine)."""
    who = f"{arm} ({against})" if against else arm
    judged = [(label, i, v) for label, i, v in verdicts if v is not Verdict.INSUFFICIENT_DATA]
    if not judged:
        return Crossover(arm=arm, band=None, band_index=None, message=f"{who}: no band with enough data")
    below = sum(1 for _, i, _ in verdicts if i < judged[0][1])  # thin bands under the first with a verdict
    for position, (label, i, v) in enumerate(judged):
        if v is not Verdict.HELPS:
            said = v.value.replace("_", " ")
            if position == 0 and below:
                message = (
                    f"{who}: does not help at {label} ({said}), the lowest load with a verdict; the {below} "
                    f"band{'s' if below > 1 else ''} below {'have' if below > 1 else 'has'} too few requests for one"
                )
            elif position == 0:
                message = f"{who}: does not help even at the lowest load ({label}: {said})"
            else:
                message = f"{who}: helps up to {judged[position - 1][0]}, stops at {label} ({said})"
            return Crossover(arm=arm, band=label, band_index=i, message=message)
    return Crossover(arm=arm, band=None, band_index=None, message=f"{who}: helps in every band with data")


def _against(arm: ArmInfo, base: ArmInfo | None) -> str:
    """How an arm's verdicts were reached where that is not on equal hardware: said with every crossover."""
    if base is None or arm.engines_ratio == 1:
        return ""
    return f"per engine against {base.name}, not on equal hardware"


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
    info = {a.name: a for a in arms}
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
                thin = min(agg.requests.get(key, 0), agg.requests.get((b, base.name), 0) if base else 0)
                verdict = Verdict.INSUFFICIENT_DATA if thin < settings.min_requests else cell_speedup.verdict
                verdicts[arm.name].append((spec_band.label, b, verdict))
            t = agg.sums.get(key, np.zeros(len(_CELL_SUMS)))
            n = agg.requests.get(key, 0)
            quantiles = agg.quantiles.get(key) or [None] * len(MEASURES)
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
                    **{m.name: _quantiles(q) for m, q in zip(MEASURES, quantiles, strict=True)},
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
        baseline=primary_baseline([a for a in arms if a.name in present]) or "",
        baselines={name: base.name for name, base in bases.items() if base is not None and name in present},
        arms=[a.name for a in arms if a.name in present],
        knobs={a.name: a.knobs for a in arms if a.name in present and a.knobs},
        cells=cells,
        crossovers=[crossover(name, v, against=_against(info[name], bases.get(name))) for name, v in verdicts.items()],
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
