"""`specdrill compare`'s pipeline: both runs loaded and checked (one line and exit 2 for what cannot be compared),
their cells compared (orchestrator/compare/cells.py), and what moved collected into compare.json."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from loadshapes.badfile import BadFileError
from orchestrator.analysis.opmap.results import MapCell, MapSettings, OperatingMap, Speedup, Verdict
from orchestrator.analysis.read.inputs import RunInputs, load_run
from orchestrator.analysis.summary import SUMMARY, Summary, summary_for
from orchestrator.compare.answer import answer_paragraph, gate_failures
from orchestrator.compare.benefit import benefit_changes, engine_changes, holds_one
from orchestrator.compare.cells import RunPair, band_sets_of, compare_runs
from orchestrator.compare.model import CellChange, ChangeVerdict, Comparison, FailOn, RunCell
from orchestrator.compare.moves import crossover_moves, policy_changes, verdict_changes
from orchestrator.compare.schedules import schedule_lines
from orchestrator.compare.setup import setup_differences, traffic_differences
from serve_apps.config_io import first_error

_CHANGE: dict[Verdict, ChangeVerdict] = {
    Verdict.HELPS: "better", Verdict.HURTS: "worse", Verdict.NO_DIFFERENCE: "no_change",
}  # fmt: skip


class NotComparable(ValueError):
    """Two runs that cannot be compared (no arm or shape in common, nothing in common bands): one line, exit 2."""


@dataclass(frozen=True)
class LoadedRun:
    inputs: RunInputs
    summary: Summary


def load_for_compare(run_dir: str) -> LoadedRun:
    """The run and its report's summary.json (compare reads the executed-policy verdicts there): a missing one, or
    one this specdrill cannot read, is one line naming the file."""
    inputs = load_run(run_dir)
    store = inputs.store
    if not store.exists(SUMMARY):
        raise BadFileError(store.path(SUMMARY), f"missing (compare reads the report's summary): run specdrill report "
                                                f"{store.root} first")  # fmt: skip
    try:
        Summary.model_validate(store.read_json(SUMMARY, "the report's summary"))
    except ValidationError as exc:
        version = (inputs.manifest.get("versions") or {}).get("specdrill") or "unknown"
        problem = f"not readable by this specdrill (written by specdrill {version}): {first_error(exc)}"
        raise BadFileError(store.path(SUMMARY), f"{problem}; run specdrill report {store.root} again") from None
    return LoadedRun(inputs, summary_for(inputs))


def common_arms(baseline: RunInputs, candidate: RunInputs, wanted: Sequence[str]) -> list[str]:
    base, cand = [a.name for a in baseline.arms], {a.name for a in candidate.arms}
    shared = [a for a in base if a in cand]
    if wanted:
        missing = [a for a in wanted if a not in shared]
        if missing:
            raise NotComparable(
                f"--arm {', '.join(missing)}: not run by both runs (both ran: {', '.join(shared) or 'none'})"
            )
        shared = [a for a in shared if a in wanted]
    if not shared:
        raise NotComparable(
            f"{baseline.store.root} and {candidate.store.root} have no arm in common (baseline: "
            f"{', '.join(base)}; candidate: {', '.join(sorted(cand))}): not runs of one campaign"
        )
    shapes = set(baseline.campaign.shapes) & set(candidate.campaign.shapes)
    if not shapes:
        raise NotComparable(
            f"{baseline.store.root} and {candidate.store.root} have no load shape in common (baseline: "
            f"{', '.join(baseline.campaign.shapes)}; candidate: {', '.join(candidate.campaign.shapes)}): "
            "not runs of one campaign"
        )
    return shared


def _run_cell(operating_map: OperatingMap, band: str, arm: str) -> RunCell:
    cell: MapCell | None = next((c for c in operating_map.cells if c.band == band and c.arm == arm), None)
    if cell is None:
        return RunCell(requests=0, verdict=None, decided_by=None, deciding=None, goodput_rps=None, tpot_p50_s=None)
    s = cell.speedup
    return RunCell(
        requests=cell.requests, verdict=None if s is None else s.verdict.value,
        decided_by=None if s is None else s.decided_by, deciding=None if s is None else s.deciding,
        goodput_rps=cell.goodput_rps, tpot_p50_s=cell.measure("tpot_s").p50,
    )  # fmt: skip


def _cell_change(pair: RunPair, j: int, b: int, arm: str, settings: MapSettings) -> CellChange:
    base_map, cand_map = pair.baseline_maps[j], pair.candidate_maps[j]
    band = base_map.bands[b].label
    s: Speedup = pair.changes[(j, b, arm)]
    n_base, n_cand = pair.requests[(j, b, arm)]
    # Paired, the cell is the baseline's band and its pairs the same requests in both runs (the candidate may have
    # banded fewer of them there by its own batch); unpaired, each run's own requests in the band.
    thin = s.pairs < settings.min_requests if s.paired else min(n_base, n_cand) < settings.min_requests
    verdict: ChangeVerdict = "not_comparable" if thin else _CHANGE.get(s.verdict, "not_comparable")
    where = f"batch {band}" if base_map.measure == "batch_size" else f"{band} req/s"
    if verdict == "not_comparable":
        said = (
            f"not comparable: {s.pairs} pairs ({settings.min_requests} needed)"
            if s.paired
            else f"not comparable: n = {n_base} baseline, {n_cand} candidate ({settings.min_requests} needed in each)"
        )
    else:
        said = s.message.split(": ", 1)[1] if ": " in s.message else s.message
        said = (
            said.replace("per-token speedup", "per-token")
            .replace("helps", "better")
            .replace("hurts", "worse")
            .replace("no difference", "no change")
        )
        said = f"{said} ({f'{s.pairs} pairs' if s.paired else f'unpaired, n = {n_base} / {n_cand}'})"
    noise = verdict == "not_comparable" or holds_one(s.goodput if s.decided_by == "goodput" else s.tpot)
    return CellChange(
        measure=base_map.measure, band=band, band_index=b, arm=arm,
        baseline=_run_cell(base_map, band, arm), candidate=_run_cell(cand_map, band, arm), verdict=verdict,
        paired=s.paired, pairs=s.pairs, decided_by=s.decided_by, tpot=s.tpot, goodput=s.goodput,
        noise_explains=noise, message=f"{arm} at {where}: {said}{', noise can explain it' if noise else ''}",
    )  # fmt: skip


def compare(
    baseline_dir: str,
    candidate_dir: str,
    *,
    arms: Sequence[str] = (),
    fail_on: Sequence[FailOn] = (),
    margin: float | None = None,
    allow_different_traffic: bool = False,
) -> Comparison:
    """`allow_different_traffic`: a gate may judge runs that sent different traffic (else NotComparable)."""
    baseline, candidate = load_for_compare(baseline_dir), load_for_compare(candidate_dir)
    shared = common_arms(baseline.inputs, candidate.inputs, arms)
    differences = traffic_differences(baseline.inputs.campaign, candidate.inputs.campaign)
    if differences and fail_on and not allow_different_traffic:
        # Two samples of other traffic differ by more than a margin's worth for reasons no engine change made: a
        # gate on them fails or passes on the traffic. The operator may say the runs are comparable anyway.
        raise NotComparable(
            f"{baseline.inputs.store.root} and {candidate.inputs.store.root} sent different traffic "
            f"({'; '.join(differences)}): --fail-on needs runs of the same traffic (the same campaign's seed, "
            "shapes and mix); pass --allow-different-traffic to gate on them anyway"
        )
    base_maps = baseline.summary.maps
    if not base_maps:
        raise NotComparable(f"{baseline.inputs.store.root}: its summary has no operating map to compare")
    settings = base_maps[0].settings
    if margin is not None:
        settings = settings.model_copy(update={"margin": margin})
    paired = not differences
    pair = compare_runs(
        baseline.inputs, candidate.inputs, band_sets_of(base_maps), shared, paired=paired, settings=settings
    )
    cells = [
        _cell_change(pair, j, b, arm, settings)
        for j, m in enumerate(pair.baseline_maps)
        for b in range(len(m.bands))
        for arm in shared
    ]
    if not any(c.baseline.requests and c.candidate.requests for c in cells):
        raise NotComparable(
            f"{baseline.inputs.store.root} and {candidate.inputs.store.root}: no band has requests of a common arm "
            "in both runs"
        )
    traffic = (
        "same traffic (seed, shapes, mix, repeats, warm-up and load match): cells compared request by request"
        if paired
        else f"different traffic ({'; '.join(differences)}): cells compared side against side (unpaired bootstrap)"
    )
    changes = verdict_changes(pair, shared)
    moves = crossover_moves(pair, shared, changes)
    benefits = benefit_changes(cells, (pair.baseline_maps, pair.candidate_maps), confidence=settings.confidence,
                               margin=settings.margin)  # fmt: skip
    offs = [a for a in shared if any(m.is_baseline(a) for m in pair.baseline_maps)]
    engines = engine_changes(cells, offs)
    names = ([a.name for a in baseline.inputs.arms], [a.name for a in candidate.inputs.arms])
    policies = policy_changes(baseline.summary, candidate.summary, *names)
    setup = setup_differences(baseline.inputs.manifest, candidate.inputs.manifest, shared)
    recommended = schedule_lines(
        (baseline.summary, baseline.inputs.campaign, baseline.inputs.store.root),
        (candidate.summary, candidate.inputs.campaign, candidate.inputs.store.root),
    )
    failures = gate_failures(fail_on, benefits, engines, changes, policies)
    comparison = Comparison(
        baseline_run=baseline.summary.run, candidate_run=candidate.summary.run,
        baseline_dir=baseline.inputs.store.root, candidate_dir=candidate.inputs.store.root, arms=shared,
        paired=paired, traffic=traffic, traffic_differences=differences,
        allow_different_traffic=allow_different_traffic,
        setup=setup, benefit_changes=benefits, engine_changes=engines, cells=cells, verdict_changes=changes,
        crossover_moves=moves,
        policy_changes=policies, recommended=recommended, answer="", margin=settings.margin,
        fail_on=list(fail_on), gate_failures=failures,
    )  # fmt: skip
    return comparison.model_copy(update={"answer": answer_paragraph(comparison)})
