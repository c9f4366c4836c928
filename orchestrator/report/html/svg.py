"""A small hand-made SVG toolkit: elements with escaped attributes, a plot frame that scales data to pixels,
round ticks, axes, legends and step lines. Coordinates are written with one decimal."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.report.html.text import esc


def coord(value: float) -> str:
    return f"{value:.1f}"


class Svg:
    """Collects SVG elements; keyword names map to attributes (font_size -> font-size, class_ -> class)."""

    def __init__(self, width: float, height: float, label: str) -> None:
        self.width, self.height, self.label = width, height, label
        self.parts: list[str] = []

    def add(self, tag: str, text: str | None = None, /, **attrs: object) -> None:
        rendered = "".join(f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attrs.items() if v is not None)
        self.parts.append(f"<{tag}{rendered}/>" if text is None else f"<{tag}{rendered}>{text}</{tag}>")

    def line(self, x1: float, y1: float, x2: float, y2: float, **attrs: object) -> None:
        self.add("line", x1=coord(x1), y1=coord(y1), x2=coord(x2), y2=coord(y2), **attrs)

    def text(self, x: float, y: float, content: str, **attrs: object) -> None:
        self.add("text", esc(content), x=coord(x), y=coord(y), **attrs)

    def rect(self, x: float, y: float, w: float, h: float, title: str | None = None, /, **attrs: object) -> None:
        inner = None if title is None else f"<title>{esc(title)}</title>"
        self.add("rect", inner, x=coord(x), y=coord(y), width=coord(w), height=coord(h), **attrs)

    def polyline(self, points: Sequence[tuple[float, float]], **attrs: object) -> None:
        self.add("polyline", points=" ".join(f"{coord(x)},{coord(y)}" for x, y in points), fill="none", **attrs)

    def render(self) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{coord(self.width)}" height="{coord(self.height)}" '
            f'viewBox="0 0 {coord(self.width)} {coord(self.height)}" role="img" aria-label="{esc(self.label)}">'
            f"<title>{esc(self.label)}</title>{''.join(self.parts)}</svg>"
        )


@dataclass(frozen=True)
class Frame:
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


def ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 up to at least `high`."""
    if not (math.isfinite(high) and high > 0):
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(math.ceil(high / step - 1e-9) + 1)]


def tick_label(value: float) -> str:
    return f"{value:.6g}"


def y_axis(svg: Svg, frame: Frame, values: Sequence[float], label: str, *, right: bool = False) -> None:
    x = frame.right if right else frame.left
    sign, anchor = (1, "start") if right else (-1, "end")
    svg.line(x, frame.top, x, frame.bottom, stroke="#666")
    for tick in values:
        y = frame.y(tick)
        if not right:
            svg.line(frame.left, y, frame.right, y, stroke="#eee")
        svg.line(x, y, x + 4 * sign, y, stroke="#666")
        svg.text(x + 7 * sign, y + 4, tick_label(tick), font_size=10, text_anchor=anchor, fill="#444")
    lx = x + 44 * sign
    svg.text(
        lx,
        frame.top + frame.height / 2,
        label,
        font_size=11,
        text_anchor="middle",
        fill="#333",
        transform=f"rotate(-90 {coord(lx)} {coord(frame.top + frame.height / 2)})",
    )


def x_axis(svg: Svg, frame: Frame, labelled: Sequence[tuple[float, str]], label: str) -> None:
    svg.line(frame.left, frame.bottom, frame.right, frame.bottom, stroke="#666")
    for value, text in labelled:
        x = frame.x(value)
        svg.line(x, frame.bottom, x, frame.bottom + 4, stroke="#666")
        svg.text(x, frame.bottom + 16, text, font_size=10, text_anchor="middle", fill="#444")
    svg.text(frame.left + frame.width / 2, frame.bottom + 32, label, font_size=11, text_anchor="middle", fill="#333")


def legend(svg: Svg, x: float, y: float, items: Sequence[tuple[str, str, str]]) -> None:
    """Items (name, colour, style: line | dashed | area | an SVG dash array such as "6 3") in one row from (x, y)."""
    for name, colour, style in items:
        if style == "area":
            svg.rect(x, y - 8, 16, 10, fill=colour, fill_opacity="0.35", stroke="none")
        else:
            dash = {"dashed": "4 3", "line": None}.get(style, style)
            svg.line(x, y - 3, x + 16, y - 3, stroke=colour, stroke_width=2, stroke_dasharray=dash)
        svg.text(x + 20, y + 1, name, font_size=11, fill="#333")
        x += 30 + 6.5 * len(name)


def no_data(svg: Svg, frame: Frame) -> None:
    svg.text(
        frame.left + frame.width / 2,
        frame.top + frame.height / 2,
        "no data",
        font_size=12,
        text_anchor="middle",
        fill="#888",
    )


def segments(points: Sequence[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """Runs of points without a gap (None or non-finite y breaks the line)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None or not math.isfinite(y):
            runs.append([])
        else:
            runs[-1].append((x, y))
    return [r for r in runs if r]


def step_path(frame: Frame, t: np.ndarray, values: np.ndarray, end: float) -> str:
    """SVG path of a step line: each value holds until the next time (the last until `end`)."""
    xs = [frame.x(float(x)) for x in t] + [frame.x(end)]
    ys = [frame.y(float(v)) for v in values]
    parts = [f"M{coord(xs[0])} {coord(ys[0])}"]
    for i in range(1, len(ys)):
        parts.append(f"H{coord(xs[i])}V{coord(ys[i])}")
    parts.append(f"H{coord(xs[-1])}")
    return "".join(parts)
