"""`specdrill report RUN_DIR`: the operating map, the executed-policy verdict, report.html and summary.json.

The run is read by orchestrator/analysis/read/inputs.py and summarised by orchestrator/analysis/summary.py (gates and
headline beside it); this module prints the console report, assembles report.html, writes the files, and exits
non-zero when a gate fails.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from loadshapes.badfile import BadFileError
from loadshapes.datasets.fit import DATASET_MARK
from orchestrator.analysis.gates import GateResult
from orchestrator.analysis.headline import ABSOLUTE_ONLY, EXEMPT_MARK, engine_confounds
from orchestrator.analysis.opmap.categories import FALLBACK_MARK, acceptance_lines
from orchestrator.analysis.opmap.category_speedup import disagreeing_lines
from orchestrator.analysis.opmap.measures import console_measures
from orchestrator.analysis.opmap.results import ArmVerification, OperatingMap, Verdict
from orchestrator.analysis.read.inputs import RunInputs, load_run
from orchestrator.analysis.summary import SUMMARY, Summary, build_summary
from orchestrator.numfmt import fixed
from orchestrator.report.html import ReportData, render_report_html
from orchestrator.report.html.overview import per_engine
from orchestrator.report.html.verification import as_configured
from orchestrator.rundir.evidence import seal
from orchestrator.rundir.layout import RunStore
from serve_apps.config_io import first_error

EXIT_GATE_FAILED = 3


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
        table.add_column(operating_map.arm_label(arm, "\n") + unequal)
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


def print_answer(summary: Summary, console: Console) -> None:
    if summary.answer is not None:
        for line in summary.answer.lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def finding_lines(checked: ArmVerification) -> list[str]:
    """Under an arm's verdict: each finding that failed, with its status, then each note on what the executed-k
    count left out (steps that skipped drafts, steps without k): true either way, and a reader of the console
    must see that the share was taken over fewer steps."""
    failed = [f"[{(f.status or 'fail').replace('_', ' ')}] {f.message}" for f in checked.findings if not f.passed]
    notes = [f"[note] {f.message}" for f in checked.findings if f.passed and f.check == "telemetry"]
    return [*failed, *notes]


def html_category_lines(summary: Summary) -> list[str]:
    """report.html's section by workload category, where there is something to read in it: categories whose
    verdicts differ, or one drafted with another's acceptance (else the page stays one screenful)."""
    differ = disagreeing_lines(summary.speedup_by_category)
    if not differ and not any(r.drafted_as for r in summary.acceptance_by_category):
        return []
    return [*differ, *acceptance_lines(summary.acceptance_by_category)]


def print_report(summary: Summary, console: Console, engine_lines: Sequence[str] = ()) -> None:
    """The console report; engine_lines: the arms' engine warnings and confounds (engine_confounds), also in the
    summary's headline and report.html's notes."""
    if summary.partial_run is not None:
        console.print(summary.partial_run, markup=False, soft_wrap=True)
    if ABSOLUTE_ONLY in summary.headline:
        console.print(ABSOLUTE_ONLY, markup=False)
    if summary.time_scale is not None:  # before any number: each is the slowed engine's, not the modelled GPU's
        console.print(summary.time_scale.line, style="yellow", markup=False, highlight=False, soft_wrap=True)
    for line in engine_lines:
        console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)
    for line in summary.headline:
        # a category drafted with another's acceptance, a data set's rows skipped: said before any figure
        if FALLBACK_MARK in line or line.startswith(DATASET_MARK):
            console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)
    print_answer(summary, console)
    for line in disagreeing_lines(summary.speedup_by_category):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for operating_map in summary.maps:
        console.print(map_table(operating_map))
    for line in acceptance_lines(summary.acceptance_by_category):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print("[bold]executed policy[/bold]")
    exempt = set(summary.exempt_arms)
    for checked in summary.verification.arms:
        mark = _STATUS_MARKS[checked.status]
        marked = EXEMPT_MARK if checked.arm in exempt and checked.status == "fail" else ""
        console.print(f"  {mark} {checked.arm}{marked} ({checked.kind}, {checked.topology}): {as_configured(checked)}")
        for line in finding_lines(checked):
            console.print(f"       {line}", markup=False)
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
        *([summary.time_scale.line] if summary.time_scale is not None else []),
        *inputs.manifest.get("generated_text", []),
        *engine_confounds(inputs.manifest),
        *summary.incomplete_units,
        *([f"requests failed in {faults} fault window(s): see Fault windows"] if faults else []),
    ]


def search_of(store: RunStore) -> Any:
    """The search path of a run `specdrill search` made (its search.json), None for any other run."""
    from orchestrator.search.record import SEARCH_FILE, SearchRecord

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
            by_category=html_category_lines(summary),
        )
    )
    store.write_text("report.html", html)
    store.write_json(SUMMARY, seal(summary.model_dump(mode="json"), inputs.traces_digest()))
    if console is not None:
        notes = [*inputs.manifest.get("generated_text", []), *engine_confounds(inputs.manifest)]
        print_report(summary, console, notes)
        console.print(f"report: {store.root}/report.html  summary: {store.root}/summary.json")
    return summary


def report_and_exit(run_dir: str) -> None:
    summary = write_report(run_dir, console=Console(width=200))
    if not summary.passed:
        sys.exit(EXIT_GATE_FAILED)
