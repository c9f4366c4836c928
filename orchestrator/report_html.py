"""report.html: one self-contained page (inline CSS and SVG, no JavaScript, nothing fetched) for a finished run.

`render_report_html(data)` is a pure function of `ReportData`: the caller gathers the operating maps, the
executed-policy verification, the engines' step timelines and the manifest, and writes the returned text.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadshapes.shapes import CrossAndRecover, Shape
from orchestrator.analysis.faults import FaultWindow
from orchestrator.analysis.results import (
    ArmVerification,
    BandKCheck,
    Crossover,
    MapCell,
    OperatingMap,
    Quantiles,
    RatioCI,
    SwitchTiming,
    Verdict,
    VerificationReport,
)
from orchestrator.analysis.timelines import MAX_POINTS, TimelineSeries

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
NO_DATA = "\u2013"  # en dash
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


def render_report_html(data: ReportData) -> str:
    body = "\n".join(
        [
            _header(data),
            _headline(data),
            _manifest_section(data.manifest),
            *(_map_section(m, i) for i, m in enumerate(data.maps)),
            _verification_section(data.verification),
            _faults_section(data.fault_windows),
            _timelines_section(data),
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(data.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
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
figcaption{color:#555;font-size:12px}svg{max-width:100%;height:auto;background:#fff}
"""


# -- text --------------------------------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return NO_DATA
    return f"{value:.{digits}f}"


def _dur(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return NO_DATA
    return f"{seconds * 1000:.1f} ms" if abs(seconds) < 1 else f"{seconds:.2f} s"


def _pct(value: float | None) -> str:
    return NO_DATA if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def _ratio(value: float | None) -> str:
    return NO_DATA if value is None or not math.isfinite(value) else f"{value:.2f}x"


def _verdict(verdict: Verdict) -> str:
    return f'<span class="v v-{_e(verdict.value)}">{_e(verdict.value.replace("_", " "))}</span>'


def _passfail(passed: bool) -> str:
    return '<span class="ok">pass</span>' if passed else '<span class="bad">FAIL</span>'


def _badge(passed: bool, text: str) -> str:
    return f'<span class="badge {"pass" if passed else "fail"}">{_e(text)}</span>'


def _list(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{_e(item)}</li>" for item in items) + "</ul>"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Header cells are escaped here; row cells are HTML already (escape their text before)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _json(value: Any) -> str:
    return NO_DATA if value is None else f"<code>{_e(json.dumps(value, sort_keys=True, default=str))}</code>"


# -- header, headline, manifest ----------------------------------------------------------------------------------


def _header(data: ReportData) -> str:
    gates = _badge(not data.gate_failures, "gates pass" if not data.gate_failures else "gates FAIL")
    verified = data.verification.passed
    policy = _badge(verified, "executed policy verified" if verified else "executed policy mismatch")
    return (
        f"<header><h1>{_e(data.title)}</h1>"
        f'<p class="meta">campaign <b>{_e(data.campaign)}</b> &middot; run <b>{_e(data.run)}</b> &middot; '
        f"generated {_e(data.generated)}</p><p>{gates}{policy}</p></header>"
    )


def _headline(data: ReportData) -> str:
    parts = []
    if data.headline:
        parts.append(f"<section><h2>Findings</h2>{_list(data.headline)}</section>")
    if data.gate_failures:
        parts.append(f'<div class="failures"><b>Gate failures</b>{_list(data.gate_failures)}</div>')
    if data.saturated_units:
        parts.append(
            '<div class="warn"><b>Load generator saturated</b> on '
            f"{len(data.saturated_units)} unit(s): it could not send on schedule, so the offered load there is "
            f"lower than the shape asks for.{_list(data.saturated_units)}</div>"
        )
    if data.engine_lagged_units:
        parts.append(
            '<div class="warn"><b>Engine lagged</b> on '
            f"{len(data.engine_lagged_units)} unit(s): the simulated engine handed tokens out later than its "
            "model's step ends (this host could not keep up), so latencies there are the host's, not the model's; "
            f"a larger engine.time_scale helps.{_list(data.engine_lagged_units)}</div>"
        )
    return "\n".join(parts)


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
            _e(name),
            _e(entry.get("policy_label", NO_DATA)),
            _e(entry.get("topology_label", NO_DATA)),
            _e(entry.get("engine_kind") or NO_DATA),
            _json(entry.get("resolved_speculative_config")),
            _dropped(entry.get("schedule_dropped")),
        ]
        for name, entry in _manifest_arms(manifest)
    ]
    arms = (
        _table(["arm", "policy", "topology", "engine", "resolved speculative config", "schedule dropped"], rows)
        if rows
        else '<p class="muted">No arms in the manifest.</p>'
    )
    return f"<section><h2>Arms</h2>{arms}{_environment(manifest)}</section>"


def _environment(manifest: dict[str, Any]) -> str:
    items = []
    for key in ("host", "versions"):
        value = manifest.get(key)
        if isinstance(value, dict) and value:
            pairs = ", ".join(f"{_e(k)} {_e(v if v is not None else NO_DATA)}" for k, v in value.items())
            items.append(f"<li><b>{_e(key)}</b>: {pairs}</li>")
    mode = manifest.get("mode")
    if mode:
        items.append(f"<li><b>mode</b>: {_e(mode)}</li>")
    return f'<ul class="meta">{"".join(items)}</ul>' if items else ""


# -- operating map -----------------------------------------------------------------------------------------------


def _cell_or_none(opmap: OperatingMap, band: str, arm: str) -> MapCell | None:
    try:
        return opmap.cell(band, arm)
    except KeyError:
        return None


def _quantiles(q: Quantiles, *names: str) -> str:
    return " / ".join(_dur(getattr(q, n)) for n in names)


def _ci(ratio: RatioCI) -> str:
    return f"{_ratio(ratio.point)} [{_num(ratio.low)}, {_num(ratio.high)}]"


def _baselines(opmap: OperatingMap) -> str:
    """Who is compared with whom: 'dyn-dp2 vs off-single per engine' where the hardware differs."""
    pairs = []
    for arm, base in opmap.baselines.items():
        if arm == base:
            continue
        cell = next((c for c in opmap.cells if c.arm == arm and c.speedup is not None), None)
        per_engine = cell is not None and cell.speedup is not None and cell.speedup.engines_ratio != 1
        pairs.append(f"{arm} vs {base}{' per engine' if per_engine else ''}")
    return "; ".join(pairs) or opmap.baseline


def _cell_html(cell: MapCell | None, baseline: bool) -> str:
    if cell is None:
        return '<span class="muted">no data</span>'
    lines = [
        f"n {cell.requests}, done {cell.completed}, errors {_pct(cell.error_rate)}",
        f"throughput {_num(cell.throughput_rps)} rps, goodput {_num(cell.goodput_rps)} rps",
        f"TTFT p50/p99 {_quantiles(cell.ttft_s, 'p50', 'p99')}",
        f"TPOT p50/p99 {_quantiles(cell.tpot_s, 'p50', 'p99')}",
        f"queue wait p50 {_dur(cell.queue_wait_s.p50)}",
        f"mean executed k {_num(cell.mean_executed_k)}",
    ]
    out = "".join(f"<div>{_e(line)}</div>" for line in lines)
    if baseline or cell.speedup is None:
        return out + '<div class="muted">baseline</div>'
    s = cell.speedup
    goodput = "goodput ratio per engine" if s.engines_ratio != 1 else "goodput ratio"
    decided = " (decided the verdict)"
    marks = {m: decided if s.decided_by in (m, "both") else "" for m in ("per-token latency", "goodput")}
    return (
        out
        + f"<div>TPOT speedup {_e(_ci(s.tpot))}{marks['per-token latency']}</div>"
        + f"<div>{goodput} {_e(_ci(s.goodput))}{marks['goodput']}</div>"
        + f'<div>{_verdict(s.verdict)} <span class="muted">{"paired" if s.paired else "unpaired"}, '
        + f"{s.pairs} pairs</span></div>"
    )


def _map_table(opmap: OperatingMap) -> str:
    head = "".join(f"<th>{_e(arm)}{' (baseline)' if opmap.is_baseline(arm) else ''}</th>" for arm in opmap.arms)
    rows = []
    for band in opmap.bands:
        cells = "".join(
            f'<td class="cell">{_cell_html(_cell_or_none(opmap, band.label, arm), opmap.is_baseline(arm))}</td>'
            for arm in opmap.arms
        )
        rows.append(f"<tr><th>{_e(band.label)}</th>{cells}</tr>")
    return (
        f"<table><thead><tr><th>band ({_e(opmap.unit)})</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _crossovers(crossovers: Sequence[Crossover]) -> str:
    if not crossovers:
        return '<p class="muted">No crossovers.</p>'
    items = "".join(f"<li><b>{_e(c.arm)}</b>: {_e(c.message)}</li>" for c in crossovers)
    return f"<ul>{items}</ul>"


def _map_section(opmap: OperatingMap, index: int) -> str:
    s = opmap.settings
    unbanded = ", ".join(f"{_e(a)} {n}" for a, n in opmap.unbanded.items() if n) or "none"
    return (
        f"<section><h2>Operating map {index + 1}: by {_e(opmap.measure.replace('_', ' '))} ({_e(opmap.unit)})</h2>"
        f'<p class="meta">baselines <b>{_e(_baselines(opmap))}</b> &middot; confidence {s.confidence:g}, '
        f"margin {s.margin:g}, {s.bootstrap_samples} bootstrap samples, at least {s.min_requests} requests per "
        f"cell &middot; requests outside every band: {unbanded}</p>"
        f"{_map_table(opmap)}"
        f"<h3>TPOT speedup over each arm's baseline</h3>{_figure(_heatmap(opmap), 'point estimate per cell')}"
        f"<h3>Goodput and TPOT by band</h3>"
        f"{_figure(_band_chart(opmap, 'goodput (req/s)', lambda c: c.goodput_rps), 'goodput per band')}"
        f"{_figure(_band_chart(opmap, 'TPOT p50 (ms)', _tpot_ms), 'median time per output token per band')}"
        f"<h3>Crossovers</h3>{_crossovers(opmap.crossovers)}</section>"
    )


def _tpot_ms(cell: MapCell) -> float | None:
    return None if cell.tpot_s.p50 is None else cell.tpot_s.p50 * 1000


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


# -- SVG ---------------------------------------------------------------------------------------------------------


def _c(value: float) -> str:
    return f"{value:.1f}"


class _Svg:
    """Collects SVG elements; keyword names map to attributes (font_size -> font-size, class_ -> class)."""

    def __init__(self, width: float, height: float, label: str) -> None:
        self.width, self.height, self.label = width, height, label
        self.parts: list[str] = []

    def add(self, tag: str, text: str | None = None, /, **attrs: object) -> None:
        rendered = "".join(f' {k.rstrip("_").replace("_", "-")}="{_e(v)}"' for k, v in attrs.items() if v is not None)
        self.parts.append(f"<{tag}{rendered}/>" if text is None else f"<{tag}{rendered}>{text}</{tag}>")

    def line(self, x1: float, y1: float, x2: float, y2: float, **attrs: object) -> None:
        self.add("line", x1=_c(x1), y1=_c(y1), x2=_c(x2), y2=_c(y2), **attrs)

    def text(self, x: float, y: float, content: str, **attrs: object) -> None:
        self.add("text", _e(content), x=_c(x), y=_c(y), **attrs)

    def rect(self, x: float, y: float, w: float, h: float, title: str | None = None, /, **attrs: object) -> None:
        inner = None if title is None else f"<title>{_e(title)}</title>"
        self.add("rect", inner, x=_c(x), y=_c(y), width=_c(w), height=_c(h), **attrs)

    def polyline(self, points: Sequence[tuple[float, float]], **attrs: object) -> None:
        self.add("polyline", points=" ".join(f"{_c(x)},{_c(y)}" for x, y in points), fill="none", **attrs)

    def render(self) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_c(self.width)}" height="{_c(self.height)}" '
            f'viewBox="0 0 {_c(self.width)} {_c(self.height)}" role="img" aria-label="{_e(self.label)}">'
            f"<title>{_e(self.label)}</title>{''.join(self.parts)}</svg>"
        )


@dataclass(frozen=True)
class _Frame:
    """A plot area in pixels and the data range it shows."""

    left: float
    top: float
    width: float
    height: float
    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, value: float) -> float:
        return self.left + (value - self.x0) / ((self.x1 - self.x0) or 1) * self.width

    def y(self, value: float) -> float:
        return self.top + self.height - (value - self.y0) / ((self.y1 - self.y0) or 1) * self.height

    @property
    def bottom(self) -> float:
        return self.top + self.height

    @property
    def right(self) -> float:
        return self.left + self.width


def _ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 up to at least `high`."""
    if not (math.isfinite(high) and high > 0):
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(math.ceil(high / step - 1e-9) + 1)]


def _tick_label(value: float) -> str:
    return f"{value:.6g}"


def _y_axis(svg: _Svg, frame: _Frame, ticks: Sequence[float], label: str, *, right: bool = False) -> None:
    x = frame.right if right else frame.left
    sign, anchor = (1, "start") if right else (-1, "end")
    svg.line(x, frame.top, x, frame.bottom, stroke="#666")
    for tick in ticks:
        y = frame.y(tick)
        if not right:
            svg.line(frame.left, y, frame.right, y, stroke="#eee")
        svg.line(x, y, x + 4 * sign, y, stroke="#666")
        svg.text(x + 7 * sign, y + 4, _tick_label(tick), font_size=10, text_anchor=anchor, fill="#444")
    lx = x + 44 * sign
    svg.text(
        lx,
        frame.top + frame.height / 2,
        label,
        font_size=11,
        text_anchor="middle",
        fill="#333",
        transform=f"rotate(-90 {_c(lx)} {_c(frame.top + frame.height / 2)})",
    )


def _x_axis(svg: _Svg, frame: _Frame, ticks: Sequence[tuple[float, str]], label: str) -> None:
    svg.line(frame.left, frame.bottom, frame.right, frame.bottom, stroke="#666")
    for value, text in ticks:
        x = frame.x(value)
        svg.line(x, frame.bottom, x, frame.bottom + 4, stroke="#666")
        svg.text(x, frame.bottom + 16, text, font_size=10, text_anchor="middle", fill="#444")
    svg.text(frame.left + frame.width / 2, frame.bottom + 32, label, font_size=11, text_anchor="middle", fill="#333")


def _legend(svg: _Svg, x: float, y: float, items: Sequence[tuple[str, str, str]]) -> None:
    """Items (name, colour, style: line | dashed | area) in one row from (x, y)."""
    for name, colour, style in items:
        if style == "area":
            svg.rect(x, y - 8, 16, 10, fill=colour, fill_opacity="0.35", stroke="none")
        else:
            dash = "4 3" if style == "dashed" else None
            svg.line(x, y - 3, x + 16, y - 3, stroke=colour, stroke_width=2, stroke_dasharray=dash)
        svg.text(x + 20, y + 1, name, font_size=11, fill="#333")
        x += 30 + 6.5 * len(name)


def _no_data(svg: _Svg, frame: _Frame) -> None:
    svg.text(
        frame.left + frame.width / 2,
        frame.top + frame.height / 2,
        "no data",
        font_size=12,
        text_anchor="middle",
        fill="#888",
    )


# -- heatmap and band charts -------------------------------------------------------------------------------------


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    r, g, bl = (round(x + (y - x) * t) for x, y in zip(a, b, strict=True))
    return f"#{r:02x}{g:02x}{bl:02x}"


def _speedup_colour(point: float | None) -> str:
    """Green above 1, red below, deeper the further from 1 (full at 1.5x or 1/1.5x); grey without a value."""
    if point is None or not math.isfinite(point) or point <= 0:
        return "#d9d9d9"
    t = min(1.0, abs(math.log(point)) / math.log(1.5))
    return _mix((247, 247, 247), (26, 152, 80) if point >= 1 else (215, 48, 39), t)


def _heat_value(cell: MapCell | None, baseline: bool) -> tuple[float | None, str, str]:
    """(colour value, text, tooltip) of a heatmap cell."""
    if baseline:
        return None, "baseline", "the baseline arm"
    if cell is None or cell.speedup is None:
        return None, NO_DATA, "no data"
    s = cell.speedup
    tip = f"TPOT speedup {_ci(s.tpot)}, {s.verdict.value.replace('_', ' ')}; {s.message}"
    return s.tpot.point, NO_DATA if s.tpot.point is None else _ratio(s.tpot.point), tip


def _heatmap(opmap: OperatingMap) -> str:
    col = max([90.0, *(7.0 * len(a) + 16 for a in opmap.arms)])
    row, left, top = 28.0, max([70.0, *(7.0 * len(b.label) + 16 for b in opmap.bands)]), 30.0
    svg = _Svg(left + col * len(opmap.arms) + 10, top + row * len(opmap.bands) + 10, "TPOT speedup heatmap")
    for j, arm in enumerate(opmap.arms):
        svg.text(left + col * (j + 0.5), top - 10, arm, font_size=11, text_anchor="middle", fill="#333")
    for i, band in enumerate(opmap.bands):
        y = top + row * i
        svg.text(left - 8, y + row / 2 + 4, band.label, font_size=11, text_anchor="end", fill="#333")
        for j, arm in enumerate(opmap.arms):
            point, text, tip = _heat_value(_cell_or_none(opmap, band.label, arm), opmap.is_baseline(arm))
            x = left + col * j
            svg.rect(x, y, col, row, f"{arm} @ {band.label}: {tip}", fill=_speedup_colour(point), stroke="#fff")
            svg.text(x + col / 2, y + row / 2 + 4, text, font_size=11, text_anchor="middle", fill="#111")
    return svg.render()


def _segments(points: Sequence[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """Runs of points without a gap (None or non-finite y breaks the line)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None or not math.isfinite(y):
            runs.append([])
        else:
            runs[-1].append((x, y))
    return [r for r in runs if r]


def _band_chart(opmap: OperatingMap, label: str, value: Callable[[MapCell], float | None]) -> str:
    """One line per arm of value(cell) against the band index."""
    series = {
        arm: [(float(i), _value_of(opmap, band.label, arm, value)) for i, band in enumerate(opmap.bands)]
        for arm in opmap.arms
    }
    values = [y for points in series.values() for _, y in points if y is not None and math.isfinite(y)]
    ticks = _ticks(max(values, default=0.0) * 1.05)
    width = max(520.0, 90.0 * len(opmap.bands) + 120)
    frame = _Frame(70, 34, width - 100, 200, -0.5, len(opmap.bands) - 0.5, 0, ticks[-1])
    svg = _Svg(width, 290, f"{label} by band")
    _y_axis(svg, frame, ticks, label)
    _x_axis(svg, frame, [(float(i), b.label) for i, b in enumerate(opmap.bands)], f"band ({opmap.unit})")
    if not values:
        _no_data(svg, frame)
    for n, points in enumerate(series.values()):
        colour = PALETTE[n % len(PALETTE)]
        for run in _segments(points):
            pixels = [(frame.x(x), frame.y(y)) for x, y in run]
            svg.polyline(pixels, stroke=colour, stroke_width=2)
            for px, py in pixels:
                svg.add("circle", cx=_c(px), cy=_c(py), r=3, fill=colour)
    _legend(svg, frame.left, 16, [(arm, PALETTE[n % len(PALETTE)], "line") for n, arm in enumerate(series)])
    return svg.render()


def _value_of(opmap: OperatingMap, band: str, arm: str, value: Callable[[MapCell], float | None]) -> float | None:
    cell = _cell_or_none(opmap, band, arm)
    if cell is None:
        return None
    result = value(cell)
    return None if result is None else float(result)


# -- verification ------------------------------------------------------------------------------------------------


def _shares(executed: dict[str, float]) -> str:
    ordered = sorted(executed.items(), key=lambda kv: -kv[1])
    return ", ".join(f"k={_e(k)} {_pct(share)}" for k, share in ordered) or NO_DATA


def _band_checks(bands: Sequence[BandKCheck]) -> str:
    rows = [
        [
            _e(b.band),
            str(b.steps),
            _e(", ".join(str(k) for k in b.configured_k) or NO_DATA),
            _shares(b.executed_k),
            _num(b.mean_executed_k),
            _pct(b.match_fraction),
            _passfail(b.passed),
        ]
        for b in bands
    ]
    header = ["band", "steps", "configured k", "executed k (share of steps)", "mean k", "match", "check"]
    return _table(header, rows) if rows else '<p class="muted">No banded steps.</p>'


def _findings(arm: ArmVerification) -> str:
    if not arm.findings:
        return ""
    items = "".join(
        f"<li>{_passfail(f.passed)} <b>{_e(f.check)}</b>{' @ ' + _e(f.band) if f.band else ''}: {_e(f.message)}</li>"
        for f in arm.findings
    )
    return f"<ul>{items}</ul>"


def _arm_verification(arm: ArmVerification) -> str:
    return (
        f"<h3>{_e(arm.arm)} {_passfail(arm.passed)}</h3>"
        f'<p class="meta">kind {_e(arm.kind)} &middot; topology {_e(arm.topology)} &middot; {arm.steps} steps '
        f"&middot; executed k matches the configured k on {_pct(arm.match_fraction)} of steps</p>"
        f"{_band_checks(arm.bands)}{_findings(arm)}"
    )


def _switch_timings(timings: Sequence[SwitchTiming]) -> str:
    if not timings:
        return ""
    rows = [
        [
            _e(t.arm),
            _e(t.shape),
            _e(t.run),
            str(t.repeat),
            _e(t.reference),
            _num(t.crossed_up_s),
            _num(t.switched_s),
            _num(t.switch_lag_s),
            _num(t.crossed_down_s),
            _num(t.recovered_s),
            _num(t.recovery_s),
            _e(t.quiet_k if t.quiet_k is not None else NO_DATA),
            _e(t.loaded_k if t.loaded_k is not None else NO_DATA),
            _num(t.bound_s),
            _passfail(t.passed),
            _e(t.message),
        ]
        for t in timings
    ]
    header = [
        "arm",
        "shape",
        "run",
        "repeat",
        "reference",
        "crossed up (s)",
        "switched (s)",
        "lag (s)",
        "crossed down (s)",
        "recovered (s)",
        "recovery (s)",
        "quiet k",
        "loaded k",
        "bound (s)",
        "check",
        "message",
    ]
    return f"<h3>Switch timings (cross and recover)</h3>{_table(header, rows)}"


def _verification_section(report: VerificationReport) -> str:
    summary = (
        _table(
            ["arm", "kind", "topology", "steps", "match", "check"],
            [
                [_e(a.arm), _e(a.kind), _e(a.topology), str(a.steps), _pct(a.match_fraction), _passfail(a.passed)]
                for a in report.arms
            ],
        )
        if report.arms
        else '<p class="muted">No arms verified.</p>'
    )
    arms = "".join(_arm_verification(a) for a in report.arms)
    return (
        f"<section><h2>Executed policy {_passfail(report.passed)}</h2>{summary}{arms}"
        f"{_switch_timings(report.switch_timings)}</section>"
    )


# -- timelines ---------------------------------------------------------------------------------------------------


def _unit_keys(table: pa.Table, arm_order: Sequence[str]) -> list[tuple[str, str, int]]:
    """The (arm, shape, repeat) units in the table: arms in the manifest's order, then by name."""
    keys = table.group_by(["arm", "shape", "repeat"]).aggregate([]).to_pylist()
    rank = {arm: i for i, arm in enumerate(arm_order)}
    units = [(str(k["arm"]), str(k["shape"]), int(k["repeat"])) for k in keys]
    return sorted(units, key=lambda u: (rank.get(u[0], len(rank)), *u))


def _unit_rows(table: pa.Table, arm: str, shape: str, repeat: int) -> pa.Table:
    mask = pc.and_(
        pc.and_(pc.equal(table["arm"], arm), pc.equal(table["shape"], shape)), pc.equal(table["repeat"], repeat)
    )
    return table.filter(mask)


def _bucket(t: np.ndarray, k: np.ndarray, batch: np.ndarray, buckets: int) -> tuple[np.ndarray, ...]:
    """Equal-time buckets over sorted t: (bucket start, mean k, max batch) for each non-empty bucket."""
    edges = np.linspace(t[0], t[-1], buckets + 1)
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, buckets - 1)
    starts = np.flatnonzero(np.diff(index, prepend=-1))
    counts = np.diff(np.append(starts, len(t)))
    return edges[index[starts]], np.add.reduceat(k, starts) / counts, np.maximum.reduceat(batch, starts)


def _series(rows: pa.Table, start_ns: int | None) -> TimelineSeries:
    start = rows["start_ns"].to_numpy().astype(np.int64)
    order = np.argsort(start, kind="stable")
    if start_ns is None or start_ns > int(start.max()):
        start_ns = int(start.min())  # no (usable) unit start: time from the first step
    t = (start[order] - start_ns) / 1e9
    inside = t >= 0  # steps before the unit started (another unit's tail) are left out
    t = t[inside]
    k = rows["k"].to_numpy(zero_copy_only=False).astype(np.float64)[order][inside]
    batch = rows["batch_size"].to_numpy().astype(np.float64)[order][inside]
    # vLLM's k is unknown (null) for a step whose drafts nobody verified: leave those steps out of the chart.
    known = ~np.isnan(k)
    t, k, batch = t[known], k[known], batch[known]
    if not len(t):
        t, k, batch = np.zeros(1), np.zeros(1), np.zeros(1)
    end = float((int(pc.max(rows["end_ns"]).as_py()) - start_ns) / 1e9)
    engines = len(pc.unique(rows["engine_id"]))
    buckets = min(MAX_POINTS, max(1, len(t) // engines))
    bucketed = len(t) > MAX_POINTS or engines > 1
    if bucketed:
        t, k, batch = _bucket(t, k, batch, buckets)
    early = rows.num_rows - int(inside.sum())
    return TimelineSeries(t, k, batch, max(end, float(t[-1])), rows.num_rows, engines, bucketed, early)


def _step_path(frame: _Frame, t: np.ndarray, values: np.ndarray, end: float) -> str:
    """SVG path of a step line: each value holds until the next time (the last until `end`)."""
    xs = [frame.x(float(x)) for x in t] + [frame.x(end)]
    ys = [frame.y(float(v)) for v in values]
    parts = [f"M{_c(xs[0])} {_c(ys[0])}"]
    for i in range(1, len(ys)):
        parts.append(f"H{_c(xs[i])}V{_c(ys[i])}")
    parts.append(f"H{_c(xs[-1])}")
    return "".join(parts)


def _rate_points(shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    """The shape's offered rate as a polyline: exact at the phase edges, sampled when there are many phases."""
    phases = shape.phases()
    if len(phases) <= MAX_POINTS // 2:
        edges = shape.boundaries()
        times = np.repeat(edges, 2)[1:-1]
        rates = np.array([r for p in phases for r in (p.rate_start, p.rate_end)], dtype=np.float64)
        return times, rates
    times = np.linspace(0.0, shape.duration, MAX_POINTS, endpoint=False)
    return times, np.asarray(shape.rate_at(times), dtype=np.float64)


def _draw_rate(svg: _Svg, frame: _Frame, shape: Shape) -> float:
    """A light filled area of the offered rate, scaled to the plot height; returns the rate at the top."""
    times, rates = _rate_points(shape)
    top = float(rates.max(initial=0.0))
    if top <= 0:
        return 0.0
    scale = _Frame(frame.left, frame.top, frame.width, frame.height, frame.x0, frame.x1, 0.0, top * 1.05)
    pixels = [(scale.x(float(t)), scale.y(float(r))) for t, r in zip(times, rates, strict=True)]
    outline = [(pixels[0][0], frame.bottom), *pixels, (pixels[-1][0], frame.bottom)]
    svg.add(
        "polygon",
        points=" ".join(f"{_c(x)},{_c(y)}" for x, y in outline),
        fill="#9ecae1",
        fill_opacity="0.35",
        stroke="none",
    )
    return top


def _draw_crossings(svg: _Svg, frame: _Frame, shape: CrossAndRecover) -> None:
    """Dashed vertical lines where the offered rate crosses the shape's boundary, up and down."""
    for offset in shape.crossing_offsets():
        x = frame.x(offset)
        svg.line(x, frame.top, x, frame.bottom, stroke="#555", stroke_width=1, stroke_dasharray="5 4")


def _faults_section(windows: Sequence[FaultWindow]) -> str:
    if not windows:
        return '<section><h2>Fault windows</h2><p class="ok">No failed requests.</p></section>'
    rows = [
        (
            _e(w.unit),
            f"{w.start_s:.1f} s",
            f"{w.end_s:.1f} s",
            f"{w.failed} of {w.ended}",
            _e(", ".join(f"{name} {count}" for name, count in sorted(w.by_class.items()))),
        )
        for w in windows
    ]
    table = _table(("unit", "from", "to", "failed", "error classes"), rows)
    return (
        "<section><h2>Fault windows</h2><p>Stretches where requests failed, by when each outcome was known "
        "(shaded red in the engine timelines).</p>"
        f"{table}</section>"
    )


def _draw_faults(svg: _Svg, frame: _Frame, windows: Sequence[FaultWindow]) -> None:
    for window in windows:
        x0, x1 = frame.x(window.start_s), frame.x(window.end_s)
        svg.rect(x0, frame.top, max(x1 - x0, 3.0), frame.bottom - frame.top, window.message,
                 fill="#cf222e", fill_opacity="0.18", class_="fault")  # fmt: skip


def _timeline_chart(unit: str, series: TimelineSeries, shape: Shape | None, faults: Sequence[FaultWindow] = ()) -> str:
    span = max(series.end, shape.duration if shape is not None else 0.0, 1e-9)
    x_ticks = _ticks(span, 8)
    k_ticks = _ticks(max(float(series.k.max(initial=0.0)), 1.0))
    b_ticks = _ticks(max(float(series.batch.max(initial=0.0)), 1.0))
    frame = _Frame(60, 34, 800, 200, 0.0, x_ticks[-1], 0.0, k_ticks[-1])
    batch_frame = _Frame(60, 34, 800, 200, 0.0, x_ticks[-1], 0.0, b_ticks[-1])
    svg = _Svg(920, 290, f"executed k and batch size over time: {unit}")
    legend: list[tuple[str, str, str]] = []
    if shape is not None:
        top = _draw_rate(svg, frame, shape)
        if top > 0:
            legend.append((f"offered rate (top {top:.3g} req/s)", "#9ecae1", "area"))
        if isinstance(shape, CrossAndRecover):
            _draw_crossings(svg, frame, shape)
            legend.append((f"crossing {shape.boundary}", "#555", "dashed"))
    if faults:
        _draw_faults(svg, frame, faults)
        legend.append(("failed requests", "#cf222e", "area"))
    _y_axis(svg, frame, k_ticks, "executed k")
    _y_axis(svg, batch_frame, b_ticks, "batch size", right=True)
    _x_axis(svg, frame, [(x, _tick_label(x)) for x in x_ticks], "seconds since unit start")
    svg.add(
        "path",
        d=_step_path(batch_frame, series.t, series.batch, series.end),
        fill="none",
        stroke="#ff7f0e",
        stroke_width="1.2",
    )
    svg.add(
        "path", d=_step_path(frame, series.t, series.k, series.end), fill="none", stroke="#1f77b4", stroke_width="1.5"
    )
    k_name, b_name = ("executed k (mean)", "batch size (max)") if series.bucketed else ("executed k", "batch size")
    _legend(svg, frame.left, 16, [(k_name, "#1f77b4", "line"), (b_name, "#ff7f0e", "line"), *legend])
    return svg.render()


def _timeline_caption(unit: str, series: TimelineSeries) -> str:
    engines = f"{series.engines} engine{'s' if series.engines != 1 else ''}"
    bucketed = f", shown as {len(series.t)} time buckets (mean k, max batch size)" if series.bucketed else ""
    early = f"; {series.early} steps before the unit's start not shown" if series.early else ""
    return f"{unit}: {series.steps} steps on {engines}{bucketed}{early}"


def _timelines_section(data: ReportData) -> str:
    if data.timeline_series is not None:
        return _series_section(data, data.timeline_series)
    table = data.timelines
    if table is None or table.num_rows == 0:
        return '<section><h2>Engine timelines</h2><p class="muted">No engine timelines in this run.</p></section>'
    missing = [c for c in TIMELINE_COLUMNS if c not in table.column_names]
    if missing:
        return (
            f'<section><h2>Engine timelines</h2><p class="bad">Timelines lack {_e(", ".join(missing))}.</p></section>'
        )
    figures = []
    arm_order = [name for name, _ in _manifest_arms(data.manifest)]
    for arm, shape_name, repeat in _unit_keys(table, arm_order):
        unit = f"{arm}/{shape_name}/r{repeat}"
        series = _series(_unit_rows(table, arm, shape_name, repeat), data.unit_starts.get(unit))
        faults = [w for w in data.fault_windows if w.unit == unit]
        chart = _timeline_chart(unit, series, data.shapes.get(shape_name), faults)
        figures.append(_figure(chart, _timeline_caption(unit, series)))
    return f"<section><h2>Engine timelines</h2>{''.join(figures)}</section>"


def _series_section(data: ReportData, series: dict[str, TimelineSeries]) -> str:
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
        chart = _timeline_chart(unit, series[unit], data.shapes.get(shape_name), faults)
        figures.append(_figure(chart, _timeline_caption(unit, series[unit])))
    return f"<section><h2>Engine timelines</h2>{''.join(figures)}</section>"
