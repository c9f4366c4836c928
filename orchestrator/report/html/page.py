"""The page: `ReportData`, the header, findings and warnings, the arms, the fault windows and the engine
timelines, and the assembly of every section into one document."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from loadshapes.shapes import Shape
from loadshapes.slo import SloConfig
from orchestrator.analysis.answer import BandAnswer
from orchestrator.analysis.headline import engine_facts_text
from orchestrator.analysis.opmap.results import OperatingMap, VerificationReport
from orchestrator.analysis.read.faults import FaultWindow
from orchestrator.analysis.serve_path import ServePath
from orchestrator.analysis.steps.timelines import TimelineSeries, series_of_table
from orchestrator.report.html.answer_table import answer_section
from orchestrator.report.html.charts import timeline_chart
from orchestrator.report.html.maps import map_section
from orchestrator.report.html.overview import ArmMarks, legend_html, off_sentence, overview_chart, per_engine
from orchestrator.report.html.text import NO_DATA, badge, bullets, esc, figure, json_code, num, table
from orchestrator.report.html.verification import verification_section

if TYPE_CHECKING:  # only a run `specdrill search` made has one: no scipy import for every other report
    from orchestrator.search.record import SearchRecord

TIMELINE_COLUMNS = ("arm", "shape", "repeat", "engine_id", "start_ns", "end_ns", "batch_size", "k")


@dataclass(frozen=True)
class ReportData:
    title: str
    run: str
    campaign: str
    generated: str  # when the report was made, as text
    manifest: dict[str, Any]  # the run's manifest.json: versions, host, arms (configured/resolved config)
    maps: list[OperatingMap]
    verification: VerificationReport
    timelines: pa.Table | None = None  # engine steps: arm, shape, repeat, engine_id, start_ns, end_ns, batch_size, k..
    # Or the series already bucketed (orchestrator/analysis/steps/timelines.py), by unit "arm/shape/r<repeat>".
    timeline_series: dict[str, TimelineSeries] | None = None
    unit_starts: dict[str, int] = field(default_factory=dict)  # "arm/shape/r<repeat>" -> unit start, epoch ns
    shapes: dict[str, Shape] = field(default_factory=dict)
    headline: list[str] = field(default_factory=list)  # notes no other section says (partial run, confounds)
    saturated_units: list[str] = field(default_factory=list)
    engine_lagged_units: list[str] = field(default_factory=list)
    gate_failures: list[str] = field(default_factory=list)
    fault_windows: list[FaultWindow] = field(default_factory=list)
    serve_paths: list[ServePath] = field(default_factory=list)
    search: SearchRecord | None = None  # the run `specdrill search` made: its path
    answer: list[str] = field(default_factory=list)  # the answer block's lines, as the console prints them
    answer_bands: list[BandAnswer] = field(default_factory=list)  # its per-band verdicts: the tables, the shading
    exempt_arms: list[str] = field(default_factory=list)  # gates.exempt_arms: their failures fail no gate
    exempt_failures: list[str] = field(default_factory=list)  # gates that failed on an exempt arm
    slo: SloConfig | None = None  # the deadlines goodput counts against, shown beside the charts that use them
    # By workload category, as the console prints it: the answer where categories' verdicts differ, acceptance
    by_category: list[str] = field(default_factory=list)


def render_report_html(data: ReportData) -> str:
    """The answer first: the gate badge, the picture and its sentences, the per-band answer; then the evidence."""
    body = "\n".join(
        [
            _header(data),
            _glance_section(data),
            answer_section(data.maps, data.answer_bands, data.answer),
            _notes(data),
            *(map_section(m, i, data.slo, _marks(data)) for i, m in enumerate(data.maps)),
            _category_section(data.by_category),
            verification_section(data.verification, data.exempt_arms),
            _manifest_section(data.manifest),
            _faults_section(data.fault_windows),
            _serve_paths_section(data.serve_paths),
            _search_section(data.search),
            _timelines_section(data),
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(data.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{margin:0 0 4px}h2{margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}h3{margin:10px 0 6px}
.meta{color:#555}.badge{display:inline-block;padding:3px 12px;border-radius:10px;color:#fff;font-weight:600;
margin-right:6px;font-size:15px}.pass{background:#1a7f37}.fail{background:#cf222e}.ok{color:#1a7f37;font-weight:600}
.bad{color:#cf222e;font-weight:600}.warn{background:#fff8c5;border:1px solid #d4a72c;padding:8px 12px;
border-radius:6px;margin:12px 0}.failures{background:#ffebe9;border:1px solid #cf222e;padding:8px 12px;
border-radius:6px;margin:12px 0}table{border-collapse:collapse;margin:8px 0;max-width:100%}th,td{border:1px solid #ddd;
padding:4px 8px;text-align:left;vertical-align:top;overflow-wrap:break-word}th{background:#f6f8fa}
code{font-size:12px;word-break:break-all}td.cell{font-size:12px;min-width:110px}.v{font-weight:600}
.v-helps{color:#1a7f37}.v-hurts{color:#cf222e}.v-no_difference{color:#555}.v-insufficient_data{color:#888}
.muted{color:#888}figure{margin:8px 0}.unverified{color:#9a6700;font-weight:600}figcaption{color:#555;font-size:12px}
svg{max-width:100%;height:auto;background:#fff}.partial{background:#9a6700}.exempt{color:#9a6700;font-weight:600}
.row{display:flex;flex-wrap:wrap;gap:8px 24px;align-items:flex-start}.row>figure,.row>div{margin:0}
.legend{display:flex;flex-wrap:wrap;gap:4px 18px;font-size:12px;margin:4px 0}.legend svg{vertical-align:middle}
.glance li{margin:3px 0}details{margin:6px 0}summary{cursor:pointer;color:#0969da}table.answer td{font-size:13px}
"""


# -- header, the picture, notes ----------------------------------------------------------------------------------


def _exempted(data: ReportData) -> list[str]:
    return sorted({a for a in data.exempt_arms if any(a in line for line in data.exempt_failures)})


def _header(data: ReportData) -> str:
    """One badge: the gates' result, with the exempt arms whose failures it does not count."""
    exempted = _exempted(data)
    exempt_text = f"; exempt, not counted: {', '.join(exempted)} failed" if exempted else ""
    if data.gate_failures:
        n = len(data.gate_failures)
        gates = badge(False, f"gates FAIL: {n} gate{'s' if n != 1 else ''} failed{exempt_text}")
    elif exempted:
        gates = badge(True, f"gates pass{exempt_text}", kind="partial")
    else:
        gates = badge(True, "gates pass")
    failures = (
        f'<div class="failures"><b>Gate failures</b>{bullets(data.gate_failures)}</div>' if data.gate_failures else ""
    )
    exempt = (
        f"<details><summary>failures on exempt arms ({len(data.exempt_failures)}): reported, they fail no gate"
        f"</summary>{bullets(data.exempt_failures)}</details>"
        if data.exempt_failures
        else ""
    )
    return (
        f"<header><h1>{esc(data.title)}</h1>"
        f'<p class="meta">campaign <b>{esc(data.campaign)}</b> &middot; run <b>{esc(data.run)}</b> &middot; '
        f"generated {esc(data.generated)}</p><p>{gates}</p>{failures}{exempt}</header>"
    )


def _not_as_configured(data: ReportData) -> dict[str, str]:
    """Arms whose executed policy check failed, with the checks that failed: their figures measure what ran."""
    return {
        a.arm: ", ".join(dict.fromkeys(f.check for f in a.findings if f.failed)) or "executed policy"
        for a in data.verification.arms
        if a.status == "fail"
    }


def _marks(data: ReportData) -> ArmMarks:
    return ArmMarks(_not_as_configured(data), exempt=data.exempt_arms)


def _glance_lines(data: ReportData) -> list[str]:
    ordered = sorted(data.maps, key=lambda m: m.measure != "offered_rate")  # as in the picture
    lines = [off_sentence(m, data.answer_bands) for m in ordered] if data.answer_bands else []
    marks = _marks(data)
    for arm, checks in marks.not_as_configured.items():
        exempt = " (exempt)" if arm in data.exempt_arms else ""
        lines.append(
            f"{arm}{exempt} did not run as configured ({checks} failed): its figures measure what ran, not its "
            "policy; hollow in the picture, hatched in the heatmaps"
        )
    for arm in dict.fromkeys(a for m in data.maps for a in m.arms if per_engine(m, a)):
        bases = sorted({m.baselines.get(arm, m.baseline) for m in data.maps if arm in m.arms})
        lines.append(
            f"{arm} is compared per engine with {', '.join(bases)}: not on equal hardware (no `off` arm on its "
            "topology), marked \u2260 in the heatmaps"
        )
    for checked in data.verification.arms:
        if checked.status in ("not_verifiable", "not_exercised"):
            unproven = [f.check for f in checked.findings if f.status == checked.status]
            said = checked.status.replace("_", " ")
            lines.append(f"{checked.arm}: {', '.join(unproven)} {said} (no evidence either way)")
    return lines


def _glance_section(data: ReportData) -> str:
    measured = any(c.speedup is not None and c.speedup.deciding.point is not None for m in data.maps for c in m.cells)
    if not measured:  # no speedup anywhere (no `off` arm, absolute figures only): nothing to picture
        return ""
    marks = _marks(data)
    lines = _glance_lines(data)
    return (
        '<section class="glance"><h2>At a glance</h2>'
        + figure(overview_chart(data.maps, data.answer_bands, marks),
                 "each arm's speedup over plain decoding on its hardware, per load band, with its interval")
        + legend_html(data.maps, marks)
        + (bullets(lines) if lines else "")
        + "</section>"
    )  # fmt: skip


def _notes(data: ReportData) -> str:
    """What no other section says: a partial run, confounds between engines, incomplete units, a saturated load
    generator or a lagging engine."""
    parts = []
    if len(data.headline) == 1:  # one note (a time scale, say) reads as a sentence, not a one-item list
        parts.append(f'<div class="warn"><b>Note:</b> {esc(data.headline[0])}</div>')
    elif data.headline:
        parts.append(f'<div class="warn"><b>Notes</b>{bullets(data.headline)}</div>')
    if data.saturated_units:
        parts.append(
            '<div class="warn"><b>Load generator saturated</b> on '
            f"{len(data.saturated_units)} unit(s): it could not send on schedule, so the offered load there is "
            f"lower than the shape asks for.{bullets(data.saturated_units)}</div>"
        )
    if data.engine_lagged_units:
        parts.append(
            '<div class="warn"><b>Engine lagged</b> on '
            f"{len(data.engine_lagged_units)} unit(s): the simulated engine handed tokens out later than its "
            "model's step ends (this host could not keep up), so latencies there are the host's, not the model's; "
            f"a larger engine.time_scale helps.{bullets(data.engine_lagged_units)}</div>"
        )
    return "\n".join(parts)


def _category_section(lines: Sequence[str]) -> str:
    if not lines:
        return ""
    return f"<h2>By workload category</h2><pre>{esc(chr(10).join(lines))}</pre>"


def _manifest_arms(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    arms = manifest.get("arms") or {}
    if isinstance(arms, dict):
        return [(str(name), entry if isinstance(entry, dict) else {}) for name, entry in arms.items()]
    return [(str(a.get("name", "?")), a) for a in arms if isinstance(a, dict)]


def _dropped(value: Any) -> str:
    if value is None:
        return NO_DATA
    return '<span class="bad">yes</span>' if value else "no"


def _manifest_section(manifest: dict[str, Any]) -> str:
    rows = [
        [
            esc(name),
            esc(entry.get("policy_label", NO_DATA)),
            esc(entry.get("topology_label", NO_DATA)),
            esc(entry.get("engine_kind") or NO_DATA),
            esc(engine_facts_text(entry) or NO_DATA),
            json_code(entry.get("resolved_speculative_config")),
            _dropped(entry.get("schedule_dropped")),
        ]
        for name, entry in _manifest_arms(manifest)
    ]
    arms = (
        table(
            ["arm", "policy", "topology", "engine", "engine facts", "resolved speculative config", "schedule dropped"],
            rows,
        )
        if rows
        else '<p class="muted">No arms in the manifest.</p>'
    )
    return f"<section><h2>Arms</h2>{arms}{_environment(manifest)}</section>"


def _environment(manifest: dict[str, Any]) -> str:
    items = []
    for key in ("host", "versions"):
        value = manifest.get(key)
        if isinstance(value, dict) and value:
            pairs = ", ".join(f"{esc(k)} {esc(v if v is not None else NO_DATA)}" for k, v in value.items())
            items.append(f"<li><b>{esc(key)}</b>: {pairs}</li>")
    mode = manifest.get("mode")
    if mode:
        items.append(f"<li><b>mode</b>: {esc(mode)}</li>")
    return f'<ul class="meta">{"".join(items)}</ul>' if items else ""


# -- fault windows and engine timelines --------------------------------------------------------------------------


def _faults_section(windows: Sequence[FaultWindow]) -> str:
    if not windows:
        return '<section><h2>Fault windows</h2><p class="ok">No failed requests.</p></section>'
    rows = [
        (
            esc(w.unit),
            f"{num(w.start_s, 1)} s",
            f"{num(w.end_s, 1)} s",
            f"{w.failed} of {w.ended}",
            esc(", ".join(f"{name} {count}" for name, count in sorted(w.by_class.items()))),
        )
        for w in windows
    ]
    faults = table(("unit", "from", "to", "failed", "error classes"), rows)
    return (
        "<section><h2>Fault windows</h2><p>Stretches where requests failed, by when each outcome was known "
        "(shaded red in the engine timelines).</p>"
        f"{faults}</section>"
    )


def _search_section(search: SearchRecord | None) -> str:
    if search is None:
        return ""

    rows = [
        (str(i + 1), f"{r.step.rate:.2f}", "another unit" if r.step.extend else "new rate", esc(r.step.why),
         esc(r.point.ratio_text),
         esc(f"not counted: {r.discarded}" if r.discarded else f"{r.point.verdict} ({r.point.measure})"),
         str(r.point.units),
         str(r.point.requests))
        for i, r in enumerate(search.steps)
    ]  # fmt: skip
    steps = table(("step", "rate req/s", "unit", "why", "ratio (> 1: the arm helps)", "verdict", "units", "requests"),
                  rows)  # fmt: skip
    outcome = f"<p><b>{esc(search.outcome.message)}</b></p>" if search.outcome is not None else ""
    return (
        f"<section><h2>Search path: {esc(search.arm)} against {esc(search.against)}</h2>"
        "<p>Each step is one short unit at a constant offered rate, the same requests to both arms; each unit is "
        "one traffic sample, and a rate's ratio and interval are taken across its samples (one sample: no "
        f"interval). {search.requests} requests in all.</p>{outcome}{steps}</section>"
    )


def _serve_paths_section(paths: Sequence[ServePath]) -> str:
    if not paths:
        return ""
    rows = [
        (esc((p.client_node or "?")[:8]), esc((p.server_node or "?")[:8]), str(p.requests), f"{p.p50_ms:.2f}",
         f"{p.p99_ms:.2f}", f"{p.max_ms:.2f}")
        for p in paths
    ]  # fmt: skip
    paths_table = table(("load worker's node", "replica's node", "requests", "p50 ms", "p99 ms", "max ms"), rows)
    return (
        "<section><h2>Serve path per node</h2><p>From a load worker's send to the replica's receipt of the request, "
        "per pair of nodes. Across two nodes the figure includes the offset between their clocks.</p>"
        f"{paths_table}</section>"
    )


def _timeline_caption(unit: str, series: TimelineSeries) -> str:
    engines = f"{series.engines} engine{'s' if series.engines != 1 else ''}"
    bucketed = f", shown as {len(series.t)} time buckets (mean k, max batch size)" if series.bucketed else ""
    early = f"; {series.early} steps before the unit's start not shown" if series.early else ""
    return f"{unit}: {series.steps} steps on {engines}{bucketed}{early}"


def _timelines_section(data: ReportData) -> str:
    if data.timeline_series is not None:
        return _series_section(data, data.timeline_series)
    steps = data.timelines
    if steps is None or steps.num_rows == 0:
        return _series_section(data, {})
    missing = [c for c in TIMELINE_COLUMNS if c not in steps.column_names]
    if missing:
        return (
            f'<section><h2>Engine timelines</h2><p class="bad">Timelines lack {esc(", ".join(missing))}.</p></section>'
        )
    return _series_section(data, series_of_table(steps, data.unit_starts))


def _flat_k(series: TimelineSeries) -> float | None:
    """The one k a unit ran at every drawn step; None where k varies (or nothing was drawn)."""
    if not len(series.k):
        return None
    low, high = float(np.min(series.k)), float(np.max(series.k))
    return low if high - low < 1e-9 else None


def _k_text(k: float) -> str:
    return str(int(k)) if float(k).is_integer() else num(k)


def _series_section(data: ReportData, series: dict[str, TimelineSeries]) -> str:
    """A chart per unit whose executed k varies (arms in the manifest's order, then by shape and repeat); a unit
    that ran one k throughout is one line of text per arm and k, as its chart would be a flat line."""
    if not series:
        return '<section><h2>Engine timelines</h2><p class="muted">No engine timelines in this run.</p></section>'
    rank = {arm: i for i, (arm, _) in enumerate(_manifest_arms(data.manifest))}

    def order(unit: str) -> tuple[int, str, str, int]:
        arm, shape_name, repeat = unit.rsplit("/", 2)
        return (rank.get(arm, len(rank)), arm, shape_name, int(repeat.removeprefix("r")))

    figures = []
    flat: dict[tuple[str, str], list[str]] = {}
    for unit in sorted(series, key=order):
        arm, shape_name, repeat = unit.rsplit("/", 2)
        faults = [w for w in data.fault_windows if w.unit == unit]
        k = _flat_k(series[unit])
        if k is not None and not faults:
            means = ", mean per time bucket" if series[unit].bucketed else ""
            flat.setdefault((arm, _k_text(k)), []).append(f"{shape_name}/{repeat} ({series[unit].steps} steps{means})")
            continue
        chart = timeline_chart(unit, series[unit], data.shapes.get(shape_name), faults)
        figures.append(figure(chart, _timeline_caption(unit, series[unit])))
    lines = [f"{arm}: executed k = {k} throughout {', '.join(units)}" for (arm, k), units in flat.items()]
    said = (
        f'<p class="meta">Charted only where the executed k varies; one k throughout (no chart):</p>{bullets(lines)}'
        if lines
        else ""
    )
    return f'<section><h2>Engine timelines</h2>{said}<div class="row">{"".join(figures)}</div></section>'
