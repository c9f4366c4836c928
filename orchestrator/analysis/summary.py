"""summary.json and the pipeline that builds it from a loaded run: bands, operating maps, the executed-policy
verification, k choices, comparisons, faults, gates and the answer, from one pass of aggregates."""

from __future__ import annotations

import itertools
import sys
import time

import duckdb
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.analysis.answer import Answer, ArmComparison, answer_of, comparison_of, comparisons_wanted
from orchestrator.analysis.gates import GateResult, engine_lagged, evaluate_gates
from orchestrator.analysis.headline import ABSOLUTE_ONLY, engine_confounds, headline
from orchestrator.analysis.opmap.bands import (
    BandSet,
    auto_rate_quantiles,
    batch_bands,
    rate_bands_at,
    rate_bands_from_edges,
)
from orchestrator.analysis.opmap.categories import CategoryAcceptance, category_acceptance, fallback_lines
from orchestrator.analysis.opmap.category_speedup import CategorySpeedup, category_speedups
from orchestrator.analysis.opmap.kchoice import BandChoice, choose_k, paired_both
from orchestrator.analysis.opmap.operating_map import operating_maps
from orchestrator.analysis.opmap.results import OperatingMap, VerificationReport
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.db import EngineSettings
from orchestrator.analysis.read.faults import FaultWindow, fault_windows_of
from orchestrator.analysis.read.inputs import RunInputs, partial_run_line
from orchestrator.analysis.read.source import Requests
from orchestrator.analysis.read.time_scale import TimeScale, time_scale_of
from orchestrator.analysis.read.views import run_requests
from orchestrator.analysis.serve_path import ServePath, serve_paths
from orchestrator.analysis.steps.kswitch_cost import k_switch_lines
from orchestrator.analysis.steps.prediction_check import prediction_check
from orchestrator.analysis.steps.timelines import TimelineSeries, timeline_series
from orchestrator.analysis.verify.executed import verify_executed_policy
from orchestrator.analysis.verify.settings import VerifySettings
from orchestrator.plan.arms import CampaignArms
from orchestrator.rundir.endpoint_samples import read_samples
from orchestrator.rundir.evidence import seal_problem
from orchestrator.rundir.layout import UnitResult
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.policies import DynamicPolicy

SUMMARY = "summary.json"


class Summary(BaseModel):
    """summary.json: everything the report concluded, for machines."""

    model_config = ConfigDict(frozen=True)
    campaign: str
    run: str
    mode: str
    generated: str
    units: list[UnitResult]
    maps: list[OperatingMap]
    verification: VerificationReport
    gates: list[GateResult]
    headline: list[str]
    partial_run: str | None = None  # the run is not finished: which units are missing, how to resume
    saturated_units: list[str]
    # The simulated engine fell behind its own step schedule (load.engine_lag_bound): one line per unit
    engine_lagged_units: list[str] = Field(default_factory=list)
    incomplete_units: list[str]  # a load worker was lost mid-run: "unit: N of M requests missing"
    fault_windows: list[FaultWindow]  # where requests failed (a replica died, a stream broke), per unit
    # send -> replica receipt per (load worker's node, replica's node); real-time runs of specdrill arms only
    serve_paths: list[ServePath] = Field(default_factory=list)
    # Per batch band: every k measured there on the same requests, and the k the evidence supports (recommend)
    k_choices: list[BandChoice] = Field(default_factory=list)
    # A rehearsal of `specdrill tune`'s schedule: per band, the measured speedup against the predicted one
    prediction_check: list[str] = Field(default_factory=list)
    # The answer first: per band the best arm on the same requests, plain decoding, too few data, crossovers
    answer: Answer | None = None
    exempt_arms: list[str] = Field(default_factory=list)  # gates.exempt_arms of the arms that ran
    # Per arm and workload category over the run: accepted / drafted with its interval, and on a simulated engine
    # the profile category a category without acceptance of its own drafted as
    acceptance_by_category: list[CategoryAcceptance] = Field(default_factory=list)
    # Per batch band, speculative arm and category: the per-token speedup over `off` on the same requests
    speedup_by_category: list[CategorySpeedup] = Field(default_factory=list)
    # A simulated engine slowed (or sped up) by engine.time_scale: what its numbers mean on the modelled GPU
    time_scale: TimeScale | None = None
    passed: bool


def schedule_bands(planned: CampaignArms) -> BandSet:
    """Batch-size bands on the boundaries of the campaign's dynamic schedules, so each band has one k."""
    edges: set[int] = set()
    for arm in planned.arms:
        if isinstance(arm.policy, DynamicPolicy):
            edges.update(start for start, _, _ in arm.policy.schedule)
            edges.update(end + 1 for _, end, _ in arm.policy.schedule)
    if not edges:
        return batch_bands()
    limit = planned.max_num_seqs
    cuts = [*sorted(e for e in edges | {1} if 1 <= e <= limit), limit + 1]
    return batch_bands([(low, high - 1) for low, high in itertools.pairwise(cuts)])


def offered_rate_bands(requests: Requests, edges: list[float] | None = None) -> BandSet | None:
    """The campaign's offered-rate bands (analysis.rate_bands), else automatic ones at quantiles of the rates
    the requests were offered; None for a run without any (closed loop only)."""
    if edges is not None:
        return rate_bands_from_edges(edges)
    row = requests.con.execute(
        f"SELECT quantile_cont(offered_rate, {auto_rate_quantiles()}), min(offered_rate), max(offered_rate) "
        "FROM requests WHERE offered_rate > 0"
    ).fetchone()
    if not row or row[0] is None:
        return None
    return rate_bands_at(row[0], lowest=row[1], highest=row[2])


def build_summary(
    inputs: RunInputs, *, engine: EngineSettings | None = None
) -> tuple[Summary, dict[str, TimelineSeries]]:
    """The summary, and the engine timelines as report.html draws them, from one pass of aggregates."""
    campaign, manifest = inputs.campaign, inputs.manifest
    units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units]
    requests = run_requests(inputs.store.root, units, settings=engine or EngineSettings.from_env())
    try:
        shapes = dict(campaign.shapes)
        band_sets = [schedule_bands(inputs.planned)]
        rate_bands = offered_rate_bands(requests, campaign.analysis.rate_bands)
        if rate_bands is not None:
            band_sets.append(rate_bands)
        maps = operating_maps(requests, inputs.arms, campaign.slo, band_sets)
        # over the pairing operating_maps left on the connection, before anything pairs other arms
        speedups_by_category = category_speedups(requests, maps[0]) if maps else []
        verification = verify_executed_policy(
            requests,
            inputs.arms,
            shapes=shapes,
            bands=band_sets[0],
            settings=VerifySettings(
                switch_bound_s=campaign.gates.max_recovery_s or VerifySettings().switch_bound_s,
            ),
            endpoint_samples=read_samples(inputs.store.root, units)
            if kind_of(campaign.engine).telemetry == "server_metrics"
            else None,
            dialect=kind_of(campaign.engine).dialect,
        )
        verification = verification.model_copy(update={"k_switch_costs": k_switch_lines(inputs)})
        # An engine shown to have dropped its schedule did not run what its policy says. A check without
        # evidence (a foreign server's config) excludes nothing: each candidate cell's executed k is checked.
        dropped = {
            a.arm for a in verification.arms for f in a.findings
            if f.failed and f.check in ("schedule_dropped", "static_fallback")
        }  # fmt: skip
        k_choices = choose_k(
            requests, maps[0], inputs.arms, band_set=0, max_k=max((a.k for a in inputs.arms), default=0),
            dropped=dropped,
        )  # fmt: skip
        comparisons = pairwise(requests, maps, inputs.arms)
        series = timeline_series(requests, {u.unit.key: u.start_ns for u in inputs.units})
        faults = fault_windows_of(requests, {u.unit.key: u.start_ns for u in inputs.units})
        workers = [
            (u.unit.arm, u.unit.shape, u.unit.repeat, w.worker, w.node_id) for u in inputs.units for w in u.workers
        ]
        paths = serve_paths(requests, workers) if manifest.get("mode", "real") == "real" else []
        peak = requests.con.execute("SELECT max(offered_rate) FROM requests WHERE offered_rate > 0").fetchone()
        scale = time_scale_of(campaign, mode=manifest.get("mode", "real"), peak_rate=peak[0] if peak else None)
        simulation = kind_of(campaign.engine).simulation(campaign.engine)
        profile = simulation.profile if simulation is not None else None
        by_category = category_acceptance(requests, profile)
    except duckdb.Error as exc:  # a file found corrupt mid-scan: one line naming it
        raise requests.blame(exc) from None
    finally:
        requests.close()
    gates = evaluate_gates(campaign, inputs.arms, verification, inputs.units)
    saturated = [u.unit.key for u in inputs.units if u.saturated]
    partial = partial_run_line(inputs)
    summary = Summary(
        campaign=campaign.name,
        run=manifest["run"],
        mode=manifest.get("mode", "real"),
        generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        units=inputs.units,
        maps=maps,
        verification=verification,
        gates=gates,
        partial_run=partial,
        headline=[
            *([partial] if partial else []),
            *([ABSOLUTE_ONLY] if campaign.analysis.absolute_only else []),
            *([scale.line] if scale else []),
            *manifest.get("datasets", []),
            *fallback_lines(by_category, profile),
            *headline(maps, verification, inputs.arms, exempt=campaign.gates.exempt_arms),
            *engine_confounds(manifest),
            *manifest.get("generated_text", []),
        ],
        saturated_units=saturated,
        engine_lagged_units=engine_lagged(inputs.units),
        incomplete_units=[
            f"{u.unit.key}: {u.missing} of {u.scheduled} requests missing (a load worker was lost)"
            for u in inputs.units
            if u.incomplete
        ],
        fault_windows=faults,
        serve_paths=paths,
        k_choices=k_choices,
        prediction_check=prediction_check(campaign.prediction, maps),
        # the answer compares arms at equal hardware through their `off` baseline: none where there is none
        answer=None
        if campaign.analysis.absolute_only
        else answer_of(maps, comparisons, verification, inputs.arms, repeats=campaign.repeats),
        exempt_arms=[a.name for a in inputs.arms if a.name in campaign.gates.exempt_arms],
        acceptance_by_category=by_category,
        speedup_by_category=speedups_by_category,
        time_scale=scale,
        passed=all(g.passed for g in gates),
    )
    return summary, series


def pairwise(requests: Requests, maps: list[OperatingMap], arms: list[ArmInfo]) -> list[ArmComparison]:
    """Every pair of arms on the same hardware, per band of every map, on the same requests (the maps' `scored`
    view must exist on `requests`)."""
    found: list[ArmComparison] = []
    for band_set, operating_map in enumerate(maps):
        wanted = comparisons_wanted(operating_map, arms)
        ratios = paired_both(requests, band_set, wanted, operating_map.settings)
        found += [comparison_of(operating_map, b, a, o, ratios[(b, a, o)]) for b, a, o in wanted if (b, a, o) in ratios]
    return found


def summary_for(inputs: RunInputs) -> Summary:
    """The run's summary.json when `specdrill report` wrote it for the same complete units and its seal holds
    (orchestrator.rundir.evidence: not edited, the same trace files), else a new one from the traces, said in one line
    on stderr: the commands that only read the aggregates (recommend) do not analyse the trace a second time."""
    if inputs.store.exists(SUMMARY):
        try:
            data = inputs.store.read_json(SUMMARY)
            written: Summary | None = Summary.model_validate(data)
        except ValueError:
            written = None  # an older specdrill's summary, or a damaged one: build a new one
        if (
            written is not None
            and written.run == inputs.manifest["run"]
            and _unit_keys(written.units) == _unit_keys(inputs.units)
        ):
            problem = seal_problem(data, inputs.traces_digest())
            if problem is None:
                return written
            print(f"specdrill: {inputs.store.path(SUMMARY)}: not used, {problem}: rebuilt from the traces",
                  file=sys.stderr, flush=True)  # fmt: skip
    summary, _ = build_summary(inputs)
    return summary


def _unit_keys(units: list[UnitResult]) -> list[tuple[str, int, int]]:
    return sorted((u.unit.key, u.rows, u.start_ns) for u in units)
