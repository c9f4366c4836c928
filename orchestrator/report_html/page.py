"""The page: `ReportData`, the header, findings and warnings, the arms, the fault windows and the engine
timelines, and the assembly of every section into one document."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from loadshapes.shapes import Shape
from loadshapes.slo import SloConfig
from orchestrator.analysis.faults import FaultWindow
from orchestrator.analysis.results import OperatingMap, VerificationReport
from orchestrator.analysis.serve_path import ServePath
from orchestrator.analysis.timelines import TimelineSeries, series_of_table
from orchestrator.report_html.charts import timeline_chart
from orchestrator.report_html.maps import map_section
from orchestrator.report_html.text import EXEMPT, NO_DATA, badge, bullets, esc, figure, json_code, table
from orchestrator.report_html.verification import verification_section

if TYPE_CHECKING:  # only a run `specdrill search` made has one: no scipy import for every other report
    from orchestrator.decide.search_record import SearchRecord

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
    # Or the series already bucketed (orchestrator/analysis/timelines.py), by unit "arm/shape/r<repeat>".
    timeline_series: dict[str, TimelineSeries] | None = None
    unit_starts: dict[str, int] = field(default_factory=dict)  # "arm/shape/r<repeat>" -> unit start, epoch ns
    shapes: dict[str, Shape] = field(default_factory=dict)
    headline: list[str] = field(default_factory=list)
    saturated_units: list[str] = field(default_factory=list)
    engine_lagged_units: list[str] = field(default_factory=list)
    gate_failures: list[str] = field(default_factory=list)
    fault_windows: list[FaultWindow] = field(default_factory=list)
    serve_paths: list[ServePath] = field(default_factory=list)
    search: SearchRecord | None = None  # the run `specdrill search` made: its path
    answer: list[str] = field(default_factory=list)  # the answer block's lines, as the console prints them
    exempt_arms: list[str] = field(default_factory=list)  # gates.exempt_arms: their failures fail no gate
    exempt_failures: list[str] = field(default_factory=list)  # gates that failed on an exempt arm
    slo: SloConfig | None = None  # the deadlines goodput counts against, shown beside the charts that use them


def render_report_html(data: ReportData) -> str:
    body = "\n".join(
        [
            _header(data),
            _answer_section(data.answer),
            _headline(data),
            _manifest_section(data.manifest),
            *(map_section(m, i, data.slo) for i, m in enumerate(data.maps)),
            verification_section(data.verification, data.exempt_arms),
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
h1{margin:0 0 4px}h2{margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}h3{margin-bottom:6px}
.meta{color:#555}.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600;
margin-right:6px}.pass{background:#1a7f37}.fail{background:#cf222e}.ok{color:#1a7f37;font-weight:600}
.bad{color:#cf222e;font-weight:600}.warn{background:#fff8c5;border:1px solid #d4a72c;padding:8px 12px;
border-radius:6px;margin:12px 0}.failures{background:#ffebe9;border:1px solid #cf222e;padding:8px 12px;
border-radius:6px;margin:12px 0}table{border-collapse:collapse;margin:8px 0}th,td{border:1px solid #ddd;
padding:4px 8px;text-align:left;vertical-align:top}th{background:#f6f8fa}code{font-size:12px;word-break:break-all}
td.cell{font-size:12px;min-width:170px}.v{font-weight:600}.v-helps{color:#1a7f37}.v-hurts{color:#cf222e}
.v-no_difference{color:#555}.v-insufficient_data{color:#888}.muted{color:#888}figure{margin:12px 0}
.unverified{color:#9a6700;font-weight:600}figcaption{color:#555;font-size:12px}svg{max-width:100%;height:auto;background:#fff}
.partial{background:#9a6700}.exempt{color:#9a6700;font-weight:600}.answer li{margin:2px 0}
"""


# -- header, headline, manifest ----------------------------------------------------------------------------------


_POLICY_BADGE = {
    "pass": ("pass", "executed policy verified"),
    "fail": ("fail", "executed policy mismatch"),
    "not_verifiable": ("partial", "executed policy not verifiable"),
    "not_exercised": ("partial", "executed policy not exercised"),
}


def _header(data: ReportData) -> str:
    exempted = sorted({a for a in data.exempt_arms if any(a in line for line in data.exempt_failures)})
    gates_text = "gates FAIL" if data.gate_failures else "gates pass"
    if exempted:
        gates_text += f" ({', '.join(exempted)} failed, exempt)"
    gates = badge(not data.gate_failures, gates_text)
    kind, text = _POLICY_BADGE[data.verification.status]
    failed = {a.arm for a in data.verification.arms if a.status == "fail"}
    failed |= {t.arm for t in data.verification.switch_timings if t.status == "fail"}
    if failed and failed <= set(data.exempt_arms):
        text += f" (only on exempt {', '.join(sorted(failed))})"
    policy = f'<span class="badge {kind}">{esc(text)}</span>'
    return (
        f"<header><h1>{esc(data.title)}</h1>"
        f'<p class="meta">campaign <b>{esc(data.campaign)}</b> &middot; run <b>{esc(data.run)}</b> &middot; '
        f"generated {esc(data.generated)}</p><p>{gates}{policy}</p></header>"
    )


def _headline(data: ReportData) -> str:
    parts = []
    if data.headline:
        parts.append(f"<section><h2>Findings</h2>{bullets(data.headline)}</section>")
    if data.gate_failures:
        parts.append(f'<div class="failures"><b>Gate failures</b>{bullets(data.gate_failures)}</div>')
    if data.exempt_failures:
        parts.append(
            f'<div class="warn"><b>Gate failures on exempt arms</b>{EXEMPT}: reported, they fail no gate.'
            f"{bullets(data.exempt_failures)}</div>"
        )
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


def _answer_section(lines: Sequence[str]) -> str:
    """The answer block first, structured as the console prints it: its title, a heading per map ("by batch
    size (...):", "what ran:"), one item per indented line."""
    if not lines:
        return ""
    parts = [f'<section class="answer"><h2>Answer</h2><p>{esc(lines[0])}</p>']
    items: list[str] = []
    for line in lines[1:]:
        if line.startswith("  "):
            items.append(line.strip())
            continue
        if items:
            parts.append(bullets(items))
            items = []
        parts.append(f"<h3>{esc(line.rstrip(':'))}</h3>")
    if items:
        parts.append(bullets(items))
    return "".join(parts) + "</section>"


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
            json_code(entry.get("resolved_speculative_config")),
            _dropped(entry.get("schedule_dropped")),
        ]
        for name, entry in _manifest_arms(manifest)
    ]
    arms = (
        table(["arm", "policy", "topology", "engine", "resolved speculative config", "schedule dropped"], rows)
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
            f"{w.start_s:.1f} s",
            f"{w.end_s:.1f} s",
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
        "<p>Each step is one short unit at a constant offered rate, the same requests to both arms; the ratio and "
        f"its interval pool every unit at that rate. {search.requests} requests in all.</p>{outcome}{steps}</section>"
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


def _series_section(data: ReportData, series: dict[str, TimelineSeries]) -> str:
    """One chart per unit: arms in the manifest's order (then by name), then by shape and repeat."""
    if not series:
        return '<section><h2>Engine timelines</h2><p class="muted">No engine timelines in this run.</p></section>'
    rank = {arm: i for i, (arm, _) in enumerate(_manifest_arms(data.manifest))}

    def order(unit: str) -> tuple[int, str, str, int]:
        arm, shape_name, repeat = unit.rsplit("/", 2)
        return (rank.get(arm, len(rank)), arm, shape_name, int(repeat.removeprefix("r")))

    figures = []
    for unit in sorted(series, key=order):
        shape_name = unit.rsplit("/", 2)[1]
        faults = [w for w in data.fault_windows if w.unit == unit]
        chart = timeline_chart(unit, series[unit], data.shapes.get(shape_name), faults)
        figures.append(figure(chart, _timeline_caption(unit, series[unit])))
    return f"<section><h2>Engine timelines</h2>{''.join(figures)}</section>"
