"""The report's charts, each one SVG: the TPOT-speedup heatmap and the per-band line charts of an operating map,
and a unit's engine timeline (executed k and batch size over time, on the shape's offered rate)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

import numpy as np

from loadshapes.shapes import CrossAndRecover, Shape
from orchestrator.analysis.opmap.results import MapCell, OperatingMap, Speedup
from orchestrator.analysis.read.faults import FaultWindow
from orchestrator.analysis.steps.timelines import MAX_POINTS, TimelineSeries
from orchestrator.report.html.svg import (
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
from orchestrator.report.html.text import NO_DATA, ci, ratio

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


def deciding_label(speedup: Speedup) -> str:
    """The name of the ratio that decided a cell's verdict, short enough for a heatmap cell."""
    if speedup.decided_by == "goodput":
        return "goodput/engine" if speedup.engines_ratio != 1 else "goodput"
    return {"both": "tpot (both)", "neither": "tpot (no verdict)"}.get(speedup.decided_by, "tpot")


def _heat_value(cell: MapCell | None, baseline: bool) -> tuple[float | None, str, str]:
    """(colour value, text, tooltip) of a heatmap cell: the ratio that decided its verdict, named."""
    if baseline:
        return None, "baseline", "the baseline arm"
    if cell is None or cell.speedup is None:
        return None, NO_DATA, "no data"
    s = cell.speedup
    point = s.deciding.point
    goodput = "goodput ratio per engine" if s.engines_ratio != 1 else "goodput ratio"
    tip = (
        f"{s.verdict.value.replace('_', ' ')}, decided by {s.decided_by}: TPOT speedup {ci(s.tpot)}, {goodput} "
        f"{ci(s.goodput)}; {s.message}"
    )
    return point, f"{deciding_label(s)} {NO_DATA if point is None else ratio(point)}", tip


def heatmap(opmap: OperatingMap, marked: Collection[str] = (), unequal: Collection[str] = ()) -> str:
    """`marked`: arms that did not run as configured (their cells hatched, "\u26a0" on the column); `unequal`:
    arms compared per engine with a baseline on other hardware ("\u2260" on the column)."""
    values = {(band.label, arm): _heat_value(cell_or_none(opmap, band.label, arm), opmap.is_baseline(arm))
              for band in opmap.bands for arm in opmap.arms}  # fmt: skip
    heads = {a: a + (" \u26a0" if a in marked else "") + (" \u2260" if a in unequal else "") for a in opmap.arms}
    col = max([90.0, *(7.0 * len(h) + 16 for h in heads.values()), *(6.5 * len(t) + 12 for _, t, _ in values.values())])
    row, left, top = 28.0, max([70.0, *(7.0 * len(b.label) + 16 for b in opmap.bands)]), 30.0
    label = "speedup heatmap: the ratio that decided each verdict"
    svg = Svg(left + col * len(opmap.arms) + 10, top + row * len(opmap.bands) + 10, label)
    hatch = f"hatch-{opmap.measure}"
    if marked:
        svg.add(
            "defs",
            f'<pattern id="{hatch}" width="7" height="7" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="3" height="7" fill="#000" fill-opacity="0.28"/></pattern>',
        )
    for j, arm in enumerate(opmap.arms):
        svg.text(left + col * (j + 0.5), top - 10, heads[arm], font_size=11, text_anchor="middle", fill="#333")
    for i, band in enumerate(opmap.bands):
        y = top + row * i
        svg.text(left - 8, y + row / 2 + 4, band.label, font_size=11, text_anchor="end", fill="#333")
        for j, arm in enumerate(opmap.arms):
            point, text, tip = values[(band.label, arm)]
            x = left + col * j
            if arm in marked:
                tip += " (did not run as configured: this measures what ran, not its policy)"
            svg.rect(x, y, col, row, f"{arm} @ {band.label}: {tip}", fill=_speedup_colour(point), stroke="#fff")
            if arm in marked:
                svg.rect(x, y, col, row, fill=f"url(#{hatch})", class_="not-as-configured")
            svg.text(x + col / 2, y + row / 2 + 4, text, font_size=11, text_anchor="middle", fill="#111")
    return svg.render()


def _value_of(opmap: OperatingMap, band: str, arm: str, value: Callable[[MapCell], float | None]) -> float | None:
    cell = cell_or_none(opmap, band, arm)
    if cell is None:
        return None
    result = value(cell)
    return None if result is None else float(result)


# Each arm its own dash and marker as well as colour: lines that coincide stay told apart where they part.
DASHES = (None, "6 3", "2 2", "8 3 2 3", "4 4", "1 3")
MARKERS = ("circle", "square", "triangle", "diamond")


def band_series(opmap: OperatingMap, value: Callable[[MapCell], float | None]) -> dict[str, list[float | None]]:
    return {arm: [_value_of(opmap, band.label, arm, value) for band in opmap.bands] for arm in opmap.arms}


def coinciding(series: dict[str, list[float | None]], *, tolerance: float = 0.005) -> list[list[str]]:
    """Groups of arms whose lines lie on one another: every band's value equal within `tolerance` of the
    chart's largest value (gaps in the same bands), and at least one value."""
    top = max((abs(v) for vs in series.values() for v in vs if v is not None and math.isfinite(v)), default=0.0)
    groups: list[list[str]] = []
    for arm, values in series.items():
        if all(v is None for v in values):
            continue
        for group in groups:
            other = series[group[0]]
            if all(
                (a is None) == (b is None) and (a is None or b is None or abs(a - b) <= tolerance * (top or 1))
                for a, b in zip(values, other, strict=True)
            ):
                group.append(arm)
                break
        else:
            groups.append([arm])
    return [g for g in groups if len(g) > 1]


def _marker(svg: Svg, shape: str, x: float, y: float, colour: str) -> None:
    r = 3.5
    if shape == "circle":
        svg.add("circle", cx=coord(x), cy=coord(y), r=3, fill=colour)
    elif shape == "square":
        svg.rect(x - r, y - r, 2 * r, 2 * r, fill=colour)
    else:
        points = [(x, y - r - 1), (x + r + 1, y + r), (x - r - 1, y + r)] if shape == "triangle" else [
            (x, y - r - 1), (x + r + 1, y), (x, y + r + 1), (x - r - 1, y)]  # fmt: skip
        svg.add("polygon", points=" ".join(f"{coord(a)},{coord(b)}" for a, b in points), fill=colour)


def band_chart(
    opmap: OperatingMap,
    label: str,
    value: Callable[[MapCell], float | None],
    threshold: tuple[float, str] | None = None,
) -> str:
    """One line per arm of value(cell) against the band index; `threshold` (value, label) a dashed line."""
    series = {arm: [(float(i), y) for i, y in enumerate(ys)] for arm, ys in band_series(opmap, value).items()}
    values = [y for points in series.values() for _, y in points if y is not None and math.isfinite(y)]
    top = max([*values, threshold[0] if threshold else 0.0], default=0.0)
    y_ticks = ticks(top * 1.05)
    # Two of these sit side by side in a 1280 px window up to six bands (the quickstart's rate map has six)
    width = max(520.0, 75.0 * len(opmap.bands) + 110)
    frame = Frame(70, 34, width - 100, 160, -0.5, len(opmap.bands) - 0.5, 0, y_ticks[-1])
    svg = Svg(width, 250, f"{label} by band")
    y_axis(svg, frame, y_ticks, label)
    x_axis(svg, frame, [(float(i), b.label) for i, b in enumerate(opmap.bands)], f"band ({opmap.unit})")
    if not values:
        no_data(svg, frame)
    if threshold is not None:
        y = frame.y(threshold[0])
        svg.line(frame.left, y, frame.right, y, stroke="#cf222e", stroke_width=1, stroke_dasharray="5 3",
                 class_="slo")  # fmt: skip
        svg.text(frame.right - 4, y - 4, threshold[1], font_size=10, text_anchor="end", fill="#cf222e")
    for n, points in enumerate(series.values()):
        colour, dash, marker = PALETTE[n % len(PALETTE)], DASHES[n % len(DASHES)], MARKERS[n % len(MARKERS)]
        for run in segments(points):
            pixels = [(frame.x(x), frame.y(y)) for x, y in run]
            svg.polyline(pixels, stroke=colour, stroke_width=2, stroke_dasharray=dash)
            for px, py in pixels:
                _marker(svg, marker, px, py, colour)
    legend(
        svg, frame.left, 16,
        [(arm, PALETTE[n % len(PALETTE)], DASHES[n % len(DASHES)] or "line") for n, arm in enumerate(series)],
    )  # fmt: skip
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
    # 600 px wide: two charts side by side on a 1280 px window
    frame = Frame(60, 46, 480, 160, 0.0, x_ticks[-1], 0.0, k_ticks[-1])
    batch_frame = Frame(60, 46, 480, 160, 0.0, x_ticks[-1], 0.0, b_ticks[-1])
    svg = Svg(600, 250, f"executed k and batch size over time: {unit}")
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
    legend(svg, frame.left, 14, [(k_name, "#1f77b4", "line"), (b_name, "#ff7f0e", "line")])
    legend(svg, frame.left, 32, items)  # a second row: one row of five items is wider than the chart
    return svg.render()
