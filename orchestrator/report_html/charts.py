"""The report's charts, each one SVG: the TPOT-speedup heatmap and the per-band line charts of an operating map,
and a unit's engine timeline (executed k and batch size over time, on the shape's offered rate)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from loadshapes.shapes import CrossAndRecover, Shape
from orchestrator.analysis.faults import FaultWindow
from orchestrator.analysis.results import MapCell, OperatingMap
from orchestrator.analysis.timelines import MAX_POINTS, TimelineSeries
from orchestrator.report_html.svg import (
    Frame,
    Svg,
    coord,
    legend,
    no_data,
    segments,
    step_path,
    tick_label,
    ticks,
    x_axis,
    y_axis,
)
from orchestrator.report_html.text import NO_DATA, ci, ratio

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


def cell_or_none(opmap: OperatingMap, band: str, arm: str) -> MapCell | None:
    try:
        return opmap.cell(band, arm)
    except KeyError:
        return None


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
    tip = f"TPOT speedup {ci(s.tpot)}, {s.verdict.value.replace('_', ' ')}; {s.message}"
    return s.tpot.point, NO_DATA if s.tpot.point is None else ratio(s.tpot.point), tip


def heatmap(opmap: OperatingMap) -> str:
    col = max([90.0, *(7.0 * len(a) + 16 for a in opmap.arms)])
    row, left, top = 28.0, max([70.0, *(7.0 * len(b.label) + 16 for b in opmap.bands)]), 30.0
    svg = Svg(left + col * len(opmap.arms) + 10, top + row * len(opmap.bands) + 10, "TPOT speedup heatmap")
    for j, arm in enumerate(opmap.arms):
        svg.text(left + col * (j + 0.5), top - 10, arm, font_size=11, text_anchor="middle", fill="#333")
    for i, band in enumerate(opmap.bands):
        y = top + row * i
        svg.text(left - 8, y + row / 2 + 4, band.label, font_size=11, text_anchor="end", fill="#333")
        for j, arm in enumerate(opmap.arms):
            point, text, tip = _heat_value(cell_or_none(opmap, band.label, arm), opmap.is_baseline(arm))
            x = left + col * j
            svg.rect(x, y, col, row, f"{arm} @ {band.label}: {tip}", fill=_speedup_colour(point), stroke="#fff")
            svg.text(x + col / 2, y + row / 2 + 4, text, font_size=11, text_anchor="middle", fill="#111")
    return svg.render()


def _value_of(opmap: OperatingMap, band: str, arm: str, value: Callable[[MapCell], float | None]) -> float | None:
    cell = cell_or_none(opmap, band, arm)
    if cell is None:
        return None
    result = value(cell)
    return None if result is None else float(result)


def band_chart(opmap: OperatingMap, label: str, value: Callable[[MapCell], float | None]) -> str:
    """One line per arm of value(cell) against the band index."""
    series = {
        arm: [(float(i), _value_of(opmap, band.label, arm, value)) for i, band in enumerate(opmap.bands)]
        for arm in opmap.arms
    }
    values = [y for points in series.values() for _, y in points if y is not None and math.isfinite(y)]
    y_ticks = ticks(max(values, default=0.0) * 1.05)
    width = max(520.0, 90.0 * len(opmap.bands) + 120)
    frame = Frame(70, 34, width - 100, 200, -0.5, len(opmap.bands) - 0.5, 0, y_ticks[-1])
    svg = Svg(width, 290, f"{label} by band")
    y_axis(svg, frame, y_ticks, label)
    x_axis(svg, frame, [(float(i), b.label) for i, b in enumerate(opmap.bands)], f"band ({opmap.unit})")
    if not values:
        no_data(svg, frame)
    for n, points in enumerate(series.values()):
        colour = PALETTE[n % len(PALETTE)]
        for run in segments(points):
            pixels = [(frame.x(x), frame.y(y)) for x, y in run]
            svg.polyline(pixels, stroke=colour, stroke_width=2)
            for px, py in pixels:
                svg.add("circle", cx=coord(px), cy=coord(py), r=3, fill=colour)
    legend(svg, frame.left, 16, [(arm, PALETTE[n % len(PALETTE)], "line") for n, arm in enumerate(series)])
    return svg.render()


# -- engine timelines --------------------------------------------------------------------------------------------


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


def _draw_rate(svg: Svg, frame: Frame, shape: Shape) -> float:
    """A light filled area of the offered rate, scaled to the plot height; returns the rate at the top."""
    times, rates = _rate_points(shape)
    top = float(rates.max(initial=0.0))
    if top <= 0:
        return 0.0
    scale = Frame(frame.left, frame.top, frame.width, frame.height, frame.x0, frame.x1, 0.0, top * 1.05)
    pixels = [(scale.x(float(t)), scale.y(float(r))) for t, r in zip(times, rates, strict=True)]
    outline = [(pixels[0][0], frame.bottom), *pixels, (pixels[-1][0], frame.bottom)]
    svg.add(
        "polygon",
        points=" ".join(f"{coord(x)},{coord(y)}" for x, y in outline),
        fill="#9ecae1",
        fill_opacity="0.35",
        stroke="none",
    )
    return top


def _draw_crossings(svg: Svg, frame: Frame, shape: CrossAndRecover) -> None:
    """Dashed vertical lines where the offered rate crosses the shape's boundary, up and down."""
    for offset in shape.crossing_offsets():
        x = frame.x(offset)
        svg.line(x, frame.top, x, frame.bottom, stroke="#555", stroke_width=1, stroke_dasharray="5 4")


def _draw_faults(svg: Svg, frame: Frame, windows: Sequence[FaultWindow]) -> None:
    for window in windows:
        x0, x1 = frame.x(window.start_s), frame.x(window.end_s)
        svg.rect(x0, frame.top, max(x1 - x0, 3.0), frame.bottom - frame.top, window.message,
                 fill="#cf222e", fill_opacity="0.18", class_="fault")  # fmt: skip


def timeline_chart(unit: str, series: TimelineSeries, shape: Shape | None, faults: Sequence[FaultWindow] = ()) -> str:
    span = max(series.end, shape.duration if shape is not None else 0.0, 1e-9)
    x_ticks = ticks(span, 8)
    k_ticks = ticks(max(float(series.k.max(initial=0.0)), 1.0))
    b_ticks = ticks(max(float(series.batch.max(initial=0.0)), 1.0))
    frame = Frame(60, 34, 800, 200, 0.0, x_ticks[-1], 0.0, k_ticks[-1])
    batch_frame = Frame(60, 34, 800, 200, 0.0, x_ticks[-1], 0.0, b_ticks[-1])
    svg = Svg(920, 290, f"executed k and batch size over time: {unit}")
    items: list[tuple[str, str, str]] = []
    if shape is not None:
        top = _draw_rate(svg, frame, shape)
        if top > 0:
            items.append((f"offered rate (top {top:.3g} req/s)", "#9ecae1", "area"))
        if isinstance(shape, CrossAndRecover):
            _draw_crossings(svg, frame, shape)
            items.append((f"crossing {shape.boundary}", "#555", "dashed"))
    if faults:
        _draw_faults(svg, frame, faults)
        items.append(("failed requests", "#cf222e", "area"))
    y_axis(svg, frame, k_ticks, "executed k")
    y_axis(svg, batch_frame, b_ticks, "batch size", right=True)
    x_axis(svg, frame, [(x, tick_label(x)) for x in x_ticks], "seconds since unit start")
    svg.add(
        "path",
        d=step_path(batch_frame, series.t, series.batch, series.end),
        fill="none",
        stroke="#ff7f0e",
        stroke_width="1.2",
    )
    svg.add(
        "path", d=step_path(frame, series.t, series.k, series.end), fill="none", stroke="#1f77b4", stroke_width="1.5"
    )
    k_name, b_name = ("executed k (mean)", "batch size (max)") if series.bucketed else ("executed k", "batch size")
    legend(svg, frame.left, 16, [(k_name, "#1f77b4", "line"), (b_name, "#ff7f0e", "line"), *items])
    return svg.render()
