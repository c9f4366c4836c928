"""The operating map: for every load band and arm, what users got, and whether the arm beat the baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.analysis.arms import ArmInfo, baseline_arm
from orchestrator.analysis.bands import BandSet
from orchestrator.analysis.bootstrap import run_blocks
from orchestrator.analysis.cell_totals import cell_totals
from orchestrator.analysis.frame import RequestFrame
from orchestrator.analysis.order_stats import grouped_quantiles
from orchestrator.analysis.pairing import baseline_partners
from orchestrator.analysis.parallel import run_parallel
from orchestrator.analysis.results import Crossover, MapCell, MapSettings, OperatingMap, Quantiles, Verdict
from orchestrator.analysis.slo import Slos, met_slo
from orchestrator.analysis.speedup import CLOCK, MET, PAIR_COLUMNS, CellBlocks, request_stats, speedup

# Columns of a cell's totals: the first four are request_stats', the speedup's inputs.
OK, STEPS, K_SUM, SPEC_STEPS, ACCEPTED = range(4, 9)


@dataclass(frozen=True)
class _Shared:
    """Everything that does not depend on the bands, computed once for all of a frame's maps."""

    stats: list[np.ndarray]  # per request, request_stats' columns
    additive: list[np.ndarray]  # per request, the columns from OK on
    partners: np.ndarray  # the baseline's row of the same request, -1 if none
    run_blocks: np.ndarray  # bootstrap block of each request within its run
    codes: list[int]  # each configured arm's code in the frame, -1 when it has no rows
    base: ArmInfo
    base_code: int


def _float(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _quantiles(row: np.ndarray) -> Quantiles:
    return Quantiles(p50=_float(row[0]), p90=_float(row[1]), p99=_float(row[2]))


def _ratio(numerator: float, denominator: float) -> float | None:
    return float(numerator / denominator) if denominator > 0 else None


def _shared(frame: RequestFrame, arms: Sequence[ArmInfo], slos: Slos, settings: MapSettings) -> _Shared:
    unknown = sorted(set(frame.arm.names) - {a.name for a in arms})
    if unknown:
        raise ValueError(f"trace has arms with no ArmInfo: {', '.join(unknown)}")
    base = baseline_arm(list(arms))
    codes = [frame.arm.names.index(a.name) if a.name in frame.arm.names else -1 for a in arms]
    base_code = codes[list(arms).index(base)]
    met = met_slo(
        ok=frame.ok,
        ttft=frame.ttft,
        tpot=frame.tpot,
        e2e=frame.e2e,
        category=frame.category.codes,
        categories=frame.category.names,
        slos=slos,
    )
    stats = request_stats(frame, met)
    partners = baseline_partners(frame, base_code) if base_code >= 0 else np.full(len(frame), -1, dtype=np.int64)
    return _Shared(
        stats=stats,
        additive=[frame.ok, frame.steps, frame.k_sum, frame.spec_steps, frame.accepted],
        partners=partners,
        run_blocks=run_blocks(frame.run, frame.offset_s, frame.run_span_s, settings.blocks),
        codes=codes,
        base=base,
        base_code=base_code,
    )


def band_codes(frame: RequestFrame, bands: BandSet) -> np.ndarray:
    measure = frame.typical_batch if bands.measure == "batch_size" else frame.offered_rate
    return bands.assign(measure)


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


def _one_map(
    frame: RequestFrame, arms: Sequence[ArmInfo], shared: _Shared, bands: BandSet, settings: MapSettings
) -> OperatingMap:
    n_arms, n_bands = len(frame.arm.names), len(bands.bands)
    n_cells = n_arms * n_bands
    band = band_codes(frame, bands)

    # Per (cell, time block), the bootstrap's columns and the pairs' (summed up, the cells'); per (cell,
    # category), the columns only the cells and the acceptance by category need.
    per_cell = len(frame.run_span_s) * settings.blocks
    n_categories = len(frame.category.names) + 1  # + no category
    summed = cell_totals(
        band=band,
        arm=frame.arm.codes,
        category=frame.category.codes,
        n_arms=n_arms,
        n_cells=n_cells,
        n_categories=n_categories,
        base_code=shared.base_code,
        run_block=shared.run_blocks,
        per_cell=per_cell,
        partner=shared.partners,
        stats=shared.stats,
        additive=shared.additive,
    )
    cell_of, totals, counts = summed.cell_of, summed.totals, summed.counts
    pair_totals, pair_counts = summed.pair_totals, summed.pair_counts
    category_totals = summed.category_totals
    by_cell_category = category_totals.reshape(n_cells, n_categories, -1)
    cell_sums = np.concatenate(
        [totals.reshape(n_cells, per_cell, -1).sum(axis=1), by_cell_category.sum(axis=1)], axis=1
    )
    requests = counts.reshape(n_cells, per_cell).sum(axis=1)
    spec_by_category = by_cell_category[:, :, SPEC_STEPS - OK]
    accepted_by_category = by_cell_category[:, :, ACCEPTED - OK]
    category_names = ["(none)", *frame.category.names]
    ttft, tpot, e2e, queue_wait = run_parallel(
        *(
            lambda c=c: grouped_quantiles(c, cell_of, n_cells, where=frame.ok)
            for c in (frame.ttft, frame.tpot, frame.e2e)
        ),
        lambda: grouped_quantiles(frame.queue_wait, cell_of, n_cells),
    )

    def blocks_of(totals: np.ndarray, counts: np.ndarray, cell: int, columns: int) -> CellBlocks:
        span = slice(cell * per_cell, (cell + 1) * per_cell)
        present = counts[span] > 0
        return CellBlocks(totals=totals[span, :columns][present], rows=int(counts[span].sum()))

    cells: list[MapCell] = []
    verdicts: dict[str, list[tuple[str, int, Verdict]]] = {a.name: [] for a in arms if a is not shared.base}
    for b, spec_band in enumerate(bands.bands):
        for arm_position, (arm, code) in enumerate(zip(arms, shared.codes, strict=True)):
            if code < 0:
                continue
            c = b * n_arms + code
            cell_speedup = None
            if arm is not shared.base:
                cell_speedup = speedup(
                    arm=blocks_of(totals, counts, c, CLOCK + 1),
                    base=blocks_of(totals, counts, b * n_arms + shared.base_code, CLOCK + 1)
                    if shared.base_code >= 0
                    else CellBlocks(totals=np.zeros((0, CLOCK + 1)), rows=0),
                    pairs=blocks_of(pair_totals, pair_counts, c, PAIR_COLUMNS),
                    baseline=shared.base.name,
                    settings=settings,
                    rng=np.random.default_rng([settings.seed, b, arm_position]),
                )
                verdicts[arm.name].append((spec_band.label, b, cell_speedup.verdict))
            t = cell_sums[c]
            cells.append(
                MapCell(
                    band=spec_band.label,
                    band_index=b,
                    arm=arm.name,
                    requests=int(requests[c]),
                    completed=round(t[OK]),
                    error_rate=_ratio(requests[c] - t[OK], requests[c]),
                    clock_s=float(t[CLOCK]),
                    throughput_rps=_ratio(t[OK], t[CLOCK]),
                    goodput_rps=_ratio(t[MET], t[CLOCK]),
                    goodput_fraction=_ratio(t[MET], requests[c]),
                    ttft_s=_quantiles(ttft[c]),
                    tpot_s=_quantiles(tpot[c]),
                    e2e_s=_quantiles(e2e[c]),
                    queue_wait_s=_quantiles(queue_wait[c]),
                    steps=round(t[STEPS]),
                    mean_executed_k=_ratio(t[K_SUM], t[STEPS]),
                    acceptance_length=None if t[SPEC_STEPS] == 0 else float(1 + t[ACCEPTED] / t[SPEC_STEPS]),
                    acceptance_length_by_category={
                        name: float(1 + accepted_by_category[c, j] / spec_by_category[c, j])
                        for j, name in enumerate(category_names)
                        if spec_by_category[c, j] > 0
                    },
                    speedup=cell_speedup,
                )
            )
    unbanded = np.bincount(frame.arm.codes[(cell_of < 0) & (frame.arm.codes >= 0)], minlength=n_arms)
    return OperatingMap(
        measure=bands.measure,
        unit=bands.unit,
        bands=list(bands.bands),
        baseline=shared.base.name,
        arms=[a.name for a, code in zip(arms, shared.codes, strict=True) if code >= 0],
        cells=cells,
        crossovers=[crossover(name, v) for name, v in verdicts.items()],
        unbanded={name: int(unbanded[i]) for i, name in enumerate(frame.arm.names)},
        settings=settings,
    )


def operating_maps(
    frame: RequestFrame,
    arms: Sequence[ArmInfo],
    slos: Slos,
    band_sets: Sequence[BandSet],
    *,
    settings: MapSettings | None = None,
) -> list[OperatingMap]:
    """One map per band set, sharing the band-independent work (SLO checks, pairing, latency columns)."""
    chosen = settings or MapSettings()
    shared = _shared(frame, arms, slos, chosen)
    return run_parallel(*(lambda b=b: _one_map(frame, arms, shared, b, chosen) for b in band_sets))


def operating_map(
    frame: RequestFrame,
    arms: Sequence[ArmInfo],
    slos: Slos,
    bands: BandSet,
    *,
    settings: MapSettings | None = None,
) -> OperatingMap:
    return operating_maps(frame, arms, slos, [bands], settings=settings)[0]
