"""`specdrill report RUN_DIR`: the operating map, the executed-policy verdict, report.html and summary.json.

Reads only what the run wrote (manifest, unit markers, traces, step timelines) and the pure analysis in
orchestrator/analysis; prints the map, writes the files, and exits non-zero when a gate fails.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.table import Table

from loadshapes.badfile import BadFileError
from orchestrator.analysis import (
    ArmInfo,
    BandSet,
    EngineSettings,
    OperatingMap,
    Requests,
    VerificationReport,
    VerifySettings,
    batch_bands,
    operating_maps,
    rate_bands_at,
    run_requests,
    verify_executed_policy,
)
from orchestrator.analysis.answer import Answer, ArmComparison, answer_of, comparison_of, comparisons_wanted
from orchestrator.analysis.bands import auto_rate_quantiles, rate_bands_from_edges
from orchestrator.analysis.faults import FaultWindow, fault_windows_of
from orchestrator.analysis.kchoice import BandChoice, choose_k, paired_both
from orchestrator.analysis.measures import console_measures
from orchestrator.analysis.results import ArmVerification, Verdict
from orchestrator.analysis.serve_path import ServePath, serve_paths
from orchestrator.analysis.timelines import TimelineSeries, timeline_series
from orchestrator.baselines import baselines
from orchestrator.calibrate.kswitch_report import k_switch_lines
from orchestrator.campaign import Campaign, GateConfig
from orchestrator.decide.prediction import prediction_check
from orchestrator.endpoint_metrics import read_samples
from orchestrator.numfmt import fixed
from orchestrator.report_html import ReportData, render_report_html
from orchestrator.report_html.overview import per_engine
from orchestrator.report_html.verification import as_configured
from orchestrator.run_evidence import check_unit_evidence, seal, seal_problem, traces_digest
from orchestrator.rundir import MANIFEST, RunStore, TraceStamp, UnitResult, read_manifest, units_of
from serve_apps.arms import EndpointEngineConfig
from serve_apps.config_io import first_error
from serve_apps.policies import DynamicPolicy

EXIT_GATE_FAILED = 3
ABSOLUTE_ONLY = "no off arm: absolute figures only (analysis.absolute_only), no speedups"
SUMMARY = "summary.json"


class GateResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    gate: str
    arm: str | None
    passed: bool
    message: str
    exempt: bool = False  # it failed on an arm of gates.exempt_arms: reported, and `passed` (it fails nothing)


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
    passed: bool


@dataclass(frozen=True)
class RunInputs:
    store: RunStore
    manifest: dict[str, Any]
    campaign: Campaign
    units: list[UnitResult]
    arms: list[ArmInfo]
    not_run: list[str]  # units the campaign plans that are not complete (an interrupted or unfinished run)
    # Complete units left out of the analysis: their arm's baseline has no complete unit yet (nothing to pair with)
    waiting: list[str] = dataclasses.field(default_factory=list)
    # Every checked unit's trace files (unit key -> file name -> size and rows), read once when the run was loaded
    trace_files: dict[str, dict[str, TraceStamp]] = dataclasses.field(default_factory=dict)

    def traces_digest(self) -> str:
        """The digest summary.json's seal holds: the analysed units' trace files, as loaded."""
        return traces_digest({u.unit.key: self.trace_files[u.unit.key] for u in self.units})


def partial_run_line(inputs: RunInputs) -> str | None:
    if not inputs.not_run:
        return None
    planned = len(inputs.units) + len(inputs.waiting) + len(inputs.not_run)
    command = "simulate" if inputs.manifest.get("mode") == "virtual" else "run"
    listed = ", ".join(inputs.not_run[:3]) + (f" and {len(inputs.not_run) - 3} more" if len(inputs.not_run) > 3 else "")
    waiting = f"; {_listed(inputs.waiting)} not analysed yet (no unit of their baseline)" if inputs.waiting else ""
    return (
        f"partial run: {len(inputs.units) + len(inputs.waiting)} of {planned} units complete (not run: {listed})"
        f"{waiting}; the figures cover only the complete units: resume with specdrill {command} CAMPAIGN --output "
        f"{inputs.store.root}"
    )


def _listed(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def load_run(run_dir: str) -> RunInputs:
    """What the run wrote, checked as it is read: a missing, truncated or foreign file is one BadFileError."""
    store = RunStore(run_dir, create=False)
    if not store.exists(MANIFEST):
        raise BadFileError(store.root, f"no {MANIFEST} (not a specdrill run directory)")
    manifest = read_manifest(store)
    try:
        campaign = Campaign.model_validate(manifest["campaign"])
        specs = campaign.arms()
    except ValidationError as exc:
        raise BadFileError(store.path(MANIFEST), f"campaign: {first_error(exc)}") from None
    except ValueError as exc:
        raise BadFileError(store.path(MANIFEST), f"campaign: {exc}") from None
    planned = [u for arm in specs for u in units_of(campaign, arm)]
    units = [store.read_marker(u) for u in planned if store.is_complete(u)]
    not_run = [u.key for u in planned if not store.is_complete(u)]
    trace_files: dict[str, dict[str, TraceStamp]] = {}
    for unit in units:
        store.check_unit_files(unit)
        trace_files[unit.unit.key] = check_unit_evidence(store, unit, manifest["units"].get(unit.unit.key))
    max_num_seqs = campaign.max_num_seqs()
    # off on the same hardware, else on one engine per engine; none where the campaign asks for absolute figures
    compared = {} if campaign.analysis.absolute_only else baselines(specs)
    # A partial run: an arm whose baseline has no complete unit yet has nothing to be compared with; its units
    # wait (the partial-run line names them) rather than be analysed against a baseline that is not there.
    done = {u.unit.arm for u in units}
    waiting = [u.unit.key for u in units if compared and compared[u.unit.arm].baseline not in done]
    units = [u for u in units if u.unit.key not in waiting]
    if not units:
        command = "simulate" if manifest.get("mode") == "virtual" else "run"
        what = (
            f"{len(waiting)} complete ({_listed(waiting)}) but no unit of their baseline "
            f"({', '.join(sorted({compared[k.split('/', 1)[0]].baseline for k in waiting}))})"
            if waiting
            else "none complete"
        )
        raise BadFileError(store.root, f"nothing to analyse yet: {len(planned)} units planned, {what}; resume with "
                                       f"specdrill {command} CAMPAIGN --output {store.root}")  # fmt: skip
    arms = [
        ArmInfo.from_policy(
            arm.name,
            arm.policy,
            topology=arm.topology,
            max_num_seqs=max_num_seqs,
            compared_with=compared[arm.name].baseline if compared else None,
            engines_ratio=compared[arm.name].engines_ratio if compared else 1.0,
        )
        for arm in campaign.arms()
        if arm.name in {u.unit.arm for u in units}
    ]
    return RunInputs(store, manifest, campaign, units, arms, not_run, waiting, trace_files)


def schedule_bands(campaign: Campaign) -> BandSet:
    """Batch-size bands on the boundaries of the campaign's dynamic schedules, so each band has one k."""
    edges: set[int] = set()
    for arm in campaign.arms():
        if isinstance(arm.policy, DynamicPolicy):
            edges.update(start for start, _, _ in arm.policy.schedule)
            edges.update(end + 1 for _, end, _ in arm.policy.schedule)
    if not edges:
        return batch_bands()
    limit = campaign.max_num_seqs()
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
        band_sets = [schedule_bands(campaign)]
        rate_bands = offered_rate_bands(requests, campaign.analysis.rate_bands)
        if rate_bands is not None:
            band_sets.append(rate_bands)
        maps = operating_maps(requests, inputs.arms, campaign.slo, band_sets)
        verification = verify_executed_policy(
            requests,
            inputs.arms,
            shapes=shapes,
            bands=band_sets[0],
            settings=VerifySettings(
                switch_bound_s=campaign.gates.max_recovery_s or VerifySettings().switch_bound_s,
            ),
            endpoint_samples=read_samples(inputs.store.root, units)
            if isinstance(campaign.engine, EndpointEngineConfig)
            else None,
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
            *headline(maps, verification, inputs.arms, exempt=campaign.gates.exempt_arms),
            *engine_confounds(manifest),
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
    (orchestrator.run_evidence: not edited, the same trace files), else a new one from the traces, said in one line
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


def engine_lagged(units: list[UnitResult]) -> list[str]:
    """One line per unit whose simulated engine lagged behind its step schedule: its latencies are the host's."""
    return [
        f"{u.unit.key}: engine lag added {u.engine_lag_share or 0.0:.0%} to the model's step time (bound "
        f"{u.engine_lag_bound or 0.0:.0%}; p99 lag {(u.engine_lag_p99_s or 0.0) * 1e3:.1f} ms)"
        for u in units
        if u.engine_lagged
    ]


def evaluate_gates(
    campaign: Campaign, arms: list[ArmInfo], verification: VerificationReport, units: list[UnitResult]
) -> list[GateResult]:
    gates = campaign.gates
    results: list[GateResult] = []
    by_name = {a.arm: a for a in verification.arms}
    for arm in arms:
        checked = by_name.get(arm.name)
        if checked is None:
            continue
        exempt = arm.name in gates.exempt_arms
        if gates.baseline_is_off and arm.kind == "off":
            results.extend(_baseline_gate(arm.name, checked, arms, exempt))
        if gates.dynamic_follows_schedule and arm.kind == "dynamic":
            results.append(_follows_schedule_gate(gates, arm.name, checked, exempt))
        if gates.fail_on_schedule_dropped:
            dropped = [
                f for f in checked.findings
                if "dropped" in f.check and (f.failed or (not f.verifiable and gates.not_verifiable == "fail"))
            ]  # fmt: skip
            results.append(
                GateResult(
                    gate="schedule_dropped", arm=arm.name, passed=not dropped or exempt,
                    exempt=bool(dropped) and exempt,
                    message=dropped[0].message + _EXEMPT * exempt if dropped else f"{arm.name}: schedule not dropped",
                )
            )  # fmt: skip
    if gates.max_recovery_s is not None:
        for timing in verification.switch_timings:
            # A switch the load never asked for fails only where checks without evidence do (gates.not_verifiable)
            held = timing.passed or (timing.status == "not_exercised" and gates.not_verifiable != "fail")
            exempt = not held and timing.arm in gates.exempt_arms
            results.append(
                GateResult(
                    gate="recovery", arm=timing.arm, passed=held or exempt, exempt=exempt,
                    message=timing.message + _EXEMPT * exempt,
                )
            )  # fmt: skip
    if gates.fail_on_saturated_generator:
        for unit in units:
            if unit.saturated:
                capped = sum(w.waited_at_connection_cap for w in unit.workers)
                at_cap = f"; {capped} requests waited at the max_in_flight connection cap" if capped else ""
                results.append(
                    GateResult(
                        gate="generator_saturated", arm=unit.unit.arm, passed=False,
                        message=f"{unit.unit.key}: load generator saturated (p99 send lateness "
                        f"{unit.lateness_p99_s * 1e3:.1f} ms{at_cap})",
                    )
                )  # fmt: skip
    if gates.fail_on_engine_lag:
        for line, unit in zip(engine_lagged(units), [u for u in units if u.engine_lagged], strict=True):
            results.append(
                GateResult(
                    gate="engine_lagged", arm=unit.unit.arm, passed=False,
                    message=f"{line}: the simulated engine fell behind its step schedule (latencies are the host's)",
                )
            )  # fmt: skip
    return results


_EXEMPT = " (exempt: reported, not failed)"


def _baseline_gate(arm: str, checked: ArmVerification, arms: list[ArmInfo], exempt: bool) -> list[GateResult]:
    """An `off` arm shown to have speculated is no baseline: the speedups of every arm compared with it are void."""
    identity = next((f for f in checked.findings if f.check == "identity" and f.failed), None)
    if identity is None:
        return []
    compared = sorted(a.name for a in arms if a.compared_with == arm and a.name != arm)
    against = f" ({', '.join(compared)})" if compared else ""
    message = f"{identity.message}: every speedup measured against {arm}{against} is void"
    return [
        GateResult(gate="baseline_is_off", arm=arm, passed=exempt, exempt=exempt, message=message + _EXEMPT * exempt)
    ]


def _follows_schedule_gate(gates: GateConfig, arm: str, checked: ArmVerification, exempt: bool) -> GateResult:
    # A check without evidence fails only where the campaign says so (gates.not_verifiable).
    strict = gates.not_verifiable == "fail"
    executed = next((f for f in checked.findings if f.check == "executed_k"), None)
    if executed is not None and not executed.verifiable and _has_finding(checked, "endpoint_approximation"):
        # A foreign server: its steps' batch sizes come from a sampled gauge, so the step-by-step match fraction
        # is the estimate's as much as the engine's. Whether the schedule ran is judged by what holds without the
        # exact batch size: no static max k where the schedule gives less, and k switching across batch sizes.
        judged = [f for f in checked.findings if f.check in ("static_fallback", "schedule_switched")]
        follows = not strict and not checked.failed and len(judged) == 2 and all(f.passed for f in judged)
        basis = (
            "judged by static_fallback and schedule_switched: "
            + "; ".join(f.message for f in judged)
            + " (the step-by-step match is not verifiable: batch sizes from sampled /metrics)"
        )
    else:
        follows = (
            (checked.passed if strict else not checked.failed)
            and checked.match_fraction is not None
            and checked.match_fraction >= gates.min_follow_fraction
        )
        basis = "executed k follows the schedule"
    # The findings' messages name the arm already (no "dyn-dp2: dyn-dp2:"); the basis does not
    reason = "; ".join(f.message for f in checked.findings if f.failed) or f"{arm}: {basis}"
    unverified = [f.check for f in checked.unverified]
    if unverified:
        reason += f" (not verifiable: {', '.join(unverified)})"
    unexercised = [f.check for f in checked.unexercised]
    if unexercised:
        reason += f" (not exercised: {', '.join(unexercised)})"
    return GateResult(
        gate="dynamic_follows_schedule", arm=arm, passed=follows or exempt, exempt=exempt and not follows,
        message=reason + _EXEMPT * (exempt and not follows),
    )  # fmt: skip


def _has_finding(checked: ArmVerification, check: str) -> bool:
    return any(f.check == check for f in checked.findings)


def headline(
    maps: list[OperatingMap], verification: VerificationReport, arms: list[ArmInfo], *, exempt: Sequence[str] = ()
) -> list[str]:
    """The few lines an operator reads first: crossovers, then every verification finding that did not pass
    (an exempt arm's failures marked so)."""
    lines: list[str] = []
    for operating_map in maps:
        for crossover in operating_map.crossovers:
            lines.append(f"[{operating_map.measure}] {crossover.message}")
    for checked in verification.arms:
        lines.extend(
            f.message + (EXEMPT_MARK if f.failed and checked.arm in exempt else "")
            for f in checked.findings
            if not f.passed
        )
    lines.extend(
        t.message + (EXEMPT_MARK if t.status == "fail" and t.arm in exempt else "") for t in verification.switch_timings
    )
    return lines


def engine_confounds(manifest: dict[str, Any]) -> list[str]:
    """Differences between the arms' engines, beyond k, that their telemetry reveals: CUDA graph mode, model
    runner, async scheduling. One line each where the arms differ (arms that do not report one are left out)."""
    arms: dict[str, dict[str, Any]] = manifest.get("arms", {})
    return [
        line
        for line in (
            graph_mode_confound(arms),
            _differs(arms, "model_runner", "model runners differ", str, "the model runner"),
            _differs(
                arms, "async_scheduling", "async scheduling differs", lambda v: "on" if v else "off", "the scheduling"
            ),
        )
        if line is not None
    ]


def graph_mode_confound(arms: dict[str, dict[str, Any]]) -> str | None:
    """Where the arms' CUDA graph modes differ, part of any difference between them is the graph mode, not k.
    The cause is named only where the arm's facts make it true: vLLM's model runner V1 forces PIECEWISE graphs
    for a dynamic schedule (vllm/config/vllm.py, _maybe_override_dynamic_sd_cudagraph_mode); model runner V2
    keeps full graphs for it, so there the modes agree and nothing is said."""
    line = _differs(arms, "cudagraph_mode", "CUDA graph modes differ", str, "the graph mode")
    if line is None:
        return None
    forced = sorted(
        name
        for name, entry in arms.items()
        if entry.get("model_runner") == "V1"
        and entry.get("cudagraph_mode") == "PIECEWISE"
        and (entry.get("policy") or {}).get("kind") == "dynamic"
    )
    if forced:
        line += f" (model runner V1 forces PIECEWISE for a dynamic schedule: {', '.join(forced)})"
    return line


def _differs(arms: dict[str, dict[str, Any]], key: str, what: str, show: Callable[[Any], str], part: str) -> str | None:
    known = {name: show(entry[key]) for name, entry in arms.items() if entry.get(key) is not None}
    if len(set(known.values())) <= 1:
        return None
    listed = ", ".join(f"{name} {value}" for name, value in sorted(known.items()))
    return f"{what} between arms ({listed}): part of their difference is {part}, not k"


# --- output -------------------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else fixed(value * 1e3, 0)


def _speedup(cell: Any) -> str:
    if cell.speedup is None:
        return "baseline"
    if cell.speedup.baseline == "(none)":
        return "no baseline"
    # The ratio shown is the one whose interval decided the verdict, named: per-token (tpot) or goodput.
    ratio = cell.speedup.deciding
    if ratio.point is None:
        return "n/a"
    colour = {Verdict.HELPS: "green", Verdict.HURTS: "red"}.get(cell.speedup.verdict, "yellow")
    low = fixed(ratio.low) if ratio.low is not None else "?"
    high = fixed(ratio.high) if ratio.high is not None else "?"
    what = "goodput" if cell.speedup.decided_by == "goodput" else "tpot"
    if cell.speedup.engines_ratio != 1 and what == "goodput":
        what = "goodput/engine"
    said = cell.speedup.verdict.value.replace("_", " ")
    return f"[{colour}]{what} {fixed(ratio.point)}x [{low},{high}] {said}[/{colour}]"


def map_table(operating_map: OperatingMap) -> Table:
    title = f"operating map by {operating_map.measure.replace('_', ' ')} ({operating_map.unit})"
    table = Table(title=title, show_lines=True)
    table.add_column("band")
    for arm in operating_map.arms:
        # A ratio over a baseline on other hardware is per engine: said where the arm's column starts
        base = operating_map.baselines.get(arm, operating_map.baseline)
        unequal = f"\n(per engine vs {base}: not equal hardware)" if per_engine(operating_map, arm) else ""
        table.add_column(arm + unequal)
    cells = {(c.band_index, c.arm): c for c in operating_map.cells}
    for i, band in enumerate(operating_map.bands):
        row = [band.label]
        for arm in operating_map.arms:
            cell = cells.get((i, arm))
            if cell is None or cell.requests == 0:
                row.append("-")
                continue
            good = "-" if cell.goodput_rps is None else f"{cell.goodput_rps:.1f}/s"
            k = "-" if cell.mean_executed_k is None else f"{cell.mean_executed_k:.2f}"
            latency = ", ".join(
                f"{m.label} {q} {_ms(getattr(cell.measure(m.name), q))} ms"
                for m in console_measures()
                for q in m.console
            )
            row.append(f"n={cell.requests} goodput {good}\n{latency}\nk {k}  {_speedup(cell)}")
        table.add_row(*row)
    return table


# Three outcomes: a check without evidence is neither a pass nor a failure.
_STATUS_MARKS = {
    "pass": "[green]PASS[/green]", "fail": "[red]FAIL[/red]", "not_verifiable": "[yellow]NOT VERIFIABLE[/yellow]",
    "not_exercised": "[yellow]NOT EXERCISED[/yellow]",
}  # fmt: skip
EXEMPT_MARK = " (exempt)"  # after an exempt arm's name wherever its failure is printed


def print_answer(summary: Summary, console: Console) -> None:
    if summary.answer is not None:
        for line in summary.answer.lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def print_report(summary: Summary, console: Console) -> None:
    if summary.partial_run is not None:
        console.print(summary.partial_run, markup=False, soft_wrap=True)
    if ABSOLUTE_ONLY in summary.headline:
        console.print(ABSOLUTE_ONLY, markup=False)
    print_answer(summary, console)
    for operating_map in summary.maps:
        console.print(map_table(operating_map))
    console.print("[bold]executed policy[/bold]")
    exempt = set(summary.exempt_arms)
    for checked in summary.verification.arms:
        mark = _STATUS_MARKS[checked.status]
        marked = EXEMPT_MARK if checked.arm in exempt and checked.status == "fail" else ""
        console.print(f"  {mark} {checked.arm}{marked} ({checked.kind}, {checked.topology}): {as_configured(checked)}")
        for finding in checked.findings:
            if not finding.passed:
                status = (finding.status or "fail").replace("_", " ")
                console.print(f"       [{status}] {finding.message}", markup=False)
    for timing in summary.verification.switch_timings:
        marked = EXEMPT_MARK if timing.arm in exempt and timing.status == "fail" else ""
        console.print(f"  {_STATUS_MARKS[timing.status or 'fail']}{marked} {timing.message}")
    for line in summary.verification.k_switch_costs:
        console.print(f"  {line}", markup=False)
    for line in summary.incomplete_units:
        console.print(f"[red]incomplete unit[/red] {line}")
    for window in summary.fault_windows:
        console.print(f"[red]fault window[/red] {window.message}")
    for path in summary.serve_paths:
        console.print(f"  {path.message}", markup=False)
    if summary.saturated_units:
        console.print(f"[yellow]load generator saturated in: {', '.join(summary.saturated_units)}[/yellow]")
    for line in summary.engine_lagged_units:
        console.print(f"[yellow]engine lagged (latencies are the host's, not the model's)[/yellow] {line}")
    if summary.prediction_check:
        console.print("[bold]measured against specdrill tune's prediction[/bold]")
        for line in summary.prediction_check:
            console.print(f"  {line}", markup=False)
    for gate in summary.gates:
        if not gate.passed:
            console.print(f"[red]gate {gate.gate} failed[/red]: {gate.message}")
        elif gate.exempt:
            console.print(f"[yellow]gate {gate.gate} failed{EXEMPT_MARK}[/yellow]: {gate.message}")
    console.print(gates_line(summary))


def gates_line(summary: Summary) -> str:
    """The verdict on the gates, naming the exempt arms whose failures it does not count."""
    exempted = sorted({g.arm or g.gate for g in summary.gates if g.exempt})
    if not summary.passed:
        return "[red]a gate failed[/red]" + (f" (exempt arms also failed: {', '.join(exempted)})" if exempted else "")
    if exempted:
        return f"[green]all gates pass[/green] except on exempt arms: {', '.join(exempted)} failed (exempt)"
    return "[green]all gates pass[/green]"


# Where report.html shows what each gate judged: its list of failed gates names the gate and points there
_GATE_SECTIONS = {"generator_saturated": "Load generator saturated", "engine_lagged": "Engine lagged"}


def gate_item(gate: GateResult) -> str:
    """A failed gate in report.html's header: which gate on which arm, and the section that shows its evidence
    (the console prints the whole message)."""
    where = f" on {gate.arm}" if gate.arm else ""
    exempt = " (exempt)" if gate.exempt else ""
    return f"{gate.gate}{where}{exempt}: see {_GATE_SECTIONS.get(gate.gate, 'Executed policy')}"


def html_notes(summary: Summary, inputs: RunInputs) -> list[str]:
    """report.html's notes: what none of its sections says (the crossovers and findings of the console's headline
    are in its answer and executed-policy sections, said once)."""
    faults = len(summary.fault_windows)
    return [
        *([summary.partial_run] if summary.partial_run else []),
        *([ABSOLUTE_ONLY] if inputs.campaign.analysis.absolute_only else []),
        *engine_confounds(inputs.manifest),
        *summary.incomplete_units,
        *([f"requests failed in {faults} fault window(s): see Fault windows"] if faults else []),
    ]


def search_of(store: RunStore) -> Any:
    """The search path of a run `specdrill search` made (its search.json), None for any other run."""
    from orchestrator.decide.search_record import SEARCH_FILE, SearchRecord

    if not store.exists(SEARCH_FILE):
        return None
    try:
        return SearchRecord.model_validate(store.read_json(SEARCH_FILE, "the search path"))
    except ValidationError as exc:
        raise BadFileError(store.path(SEARCH_FILE), f"not a search record: {first_error(exc)}") from None


def write_report(run_dir: str, *, console: Console | None = None) -> Summary:
    """report.html, then summary.json, each written atomically. The previous summary.json is removed before
    anything is read: a report that fails (a corrupt file, an unwritable output) leaves none that looks like the
    current run's, so `recommend` analyses the run itself and meets the same error."""
    inputs = load_run(run_dir)
    store = inputs.store
    store.remove(SUMMARY)
    summary, series = build_summary(inputs)
    html = render_report_html(
        ReportData(
            title=f"specdrill report: {summary.campaign}",
            run=summary.run,
            campaign=summary.campaign,
            generated=summary.generated,
            manifest=inputs.manifest,
            maps=summary.maps,
            verification=summary.verification,
            timeline_series=series,
            unit_starts={u.unit.key: u.start_ns for u in inputs.units},
            shapes=dict(inputs.campaign.shapes),
            headline=html_notes(summary, inputs),
            saturated_units=summary.saturated_units,
            engine_lagged_units=summary.engine_lagged_units,
            gate_failures=[gate_item(g) for g in summary.gates if not g.passed],
            fault_windows=summary.fault_windows,
            serve_paths=summary.serve_paths,
            search=search_of(store),
            answer=summary.answer.lines if summary.answer is not None else [],
            answer_bands=summary.answer.bands if summary.answer is not None else [],
            exempt_arms=summary.exempt_arms,
            exempt_failures=[gate_item(g) for g in summary.gates if g.exempt],
            slo=inputs.campaign.slo,
        )
    )
    store.write_text("report.html", html)
    store.write_json(SUMMARY, seal(summary.model_dump(mode="json"), inputs.traces_digest()))
    if console is not None:
        print_report(summary, console)
        console.print(f"report: {store.root}/report.html  summary: {store.root}/summary.json")
    return summary


def report_and_exit(run_dir: str) -> None:
    summary = write_report(run_dir, console=Console(width=200))
    if not summary.passed:
        sys.exit(EXIT_GATE_FAILED)
