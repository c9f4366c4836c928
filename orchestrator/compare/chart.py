"""compare.html's chart, one SVG per band set: each speculative arm's speedup over `off` against load, the
baseline run dashed with hollow markers and the candidate solid, each point with its interval, on the report's
SVG toolkit (report_html/svg.py) and its palette (report_html/charts.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.analysis.opmap.results import RatioCI
from orchestrator.compare.model import BenefitChange
from orchestrator.report.html.charts import PALETTE
from orchestrator.report.html.svg import Frame, Svg, coord, legend, no_data, segments, ticks, x_axis, y_axis
from orchestrator.report.html.text import ci

_OFFSET = {"baseline": -0.12, "candidate": 0.12}  # the two runs' points side by side in a band
_DASH = {"baseline": "6 3", "candidate": None}


def _draw_run(svg: Svg, frame: Frame, arm: str, run: str, colour: str, points: Sequence[RatioCI | None]) -> None:
    shift = _OFFSET[run]
    line = [(i + shift, None if p is None else p.point) for i, p in enumerate(points)]
    for part in segments(line):
        svg.polyline([(frame.x(x), frame.y(y)) for x, y in part], stroke=colour, stroke_width=2,
                     stroke_dasharray=_DASH[run])  # fmt: skip
    for i, p in enumerate(points):
        if p is None or p.point is None or not math.isfinite(p.point):
            continue
        x = frame.x(i + shift)
        if p.low is not None and p.high is not None:
            svg.line(x, frame.y(p.low), x, frame.y(p.high), stroke=colour, stroke_width=1.5, class_="interval")
        fill = colour if run == "candidate" else "#fff"
        svg.add("circle", f"<title>{arm}, {run} run, band {i + 1}: {ci(p)}</title>", cx=coord(x),
                cy=coord(frame.y(p.point)), r=3.5, fill=fill, stroke=colour, stroke_width=1.5)  # fmt: skip


def benefit_chart(benefits: Sequence[BenefitChange], bands: Sequence[str], unit: str) -> str:
    """`benefits` of one band set; `bands`: its labels in order. y: the arm's ratio over `off` (> 1: faster)."""
    arms = list(dict.fromkeys(b.arm for b in benefits))
    at = {(b.arm, b.band): b for b in benefits}
    series = {
        arm: {run: [getattr(at.get((arm, band)), run, None) for band in bands] for run in ("baseline", "candidate")}
        for arm in arms
    }  # fmt: skip
    values = [v for runs in series.values() for points in runs.values() for p in points if p is not None
              for v in (p.point, p.high) if v is not None and math.isfinite(v)]  # fmt: skip
    y_ticks = ticks(max([*values, 1.0]) * 1.05)
    width = max(520.0, 90.0 * len(bands) + 120)
    frame = Frame(70, 52, width - 100, 170, -0.5, len(bands) - 0.5, 0, y_ticks[-1])
    svg = Svg(width, 270, f"speedup over off by band ({unit}): baseline dashed, candidate solid")
    y_axis(svg, frame, y_ticks, "speedup over off")
    x_axis(svg, frame, [(float(i), band) for i, band in enumerate(bands)], f"band ({unit})")
    one = frame.y(1.0)
    svg.line(frame.left, one, frame.right, one, stroke="#555", stroke_dasharray="5 3", class_="off-line")
    svg.text(frame.right - 4, one - 4, "off (1x)", font_size=10, text_anchor="end", fill="#555")
    if not values:
        no_data(svg, frame)
    for n, arm in enumerate(arms):
        for run in ("baseline", "candidate"):
            _draw_run(svg, frame, arm, run, PALETTE[n % len(PALETTE)], series[arm][run])
    legend(svg, frame.left, 16, [(arm, PALETTE[n % len(PALETTE)], "line") for n, arm in enumerate(arms)])
    legend(svg, frame.left, 34, [("baseline run", "#333", "6 3"), ("candidate run", "#333", "line")])
    return svg.render()
