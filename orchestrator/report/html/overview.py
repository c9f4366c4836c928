"""The top of report.html: one picture of every arm's speedup against load, with its interval, the bands where
plain decoding is preferable shaded, and the arms that did not run as configured drawn hollow; then the few
sentences that picture cannot say on its own.

Where speculation should be off comes from the answer's per-band verdicts (orchestrator/analysis/answer.py):
a band is shaded only where, on that hardware, plain decoding is best or no arm beats it on the same requests,
never where the data are too few.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.analysis.answer import BandAnswer
from orchestrator.analysis.opmap.results import OperatingMap, Verdict
from orchestrator.report.html.charts import PALETTE, cell_or_none, deciding_label
from orchestrator.report.html.svg import Frame, Svg, coord, no_data, tick_label, ticks
from orchestrator.report.html.text import ci, esc

WIDTH = 1180.0  # the page's content is 1232 px wide at a 1280 px window: the picture fits without scrolling
OFF_FILL = "#f6d5d2"


@dataclass(frozen=True)
class OffBand:
    """A band where speculation should be off on one hardware: plain decoding best, or no arm better than it."""

    band_index: int
    band: str
    hardware: str
    how: str  # "plain decoding is best" | "no arm beats plain decoding"


def _is_off(found: BandAnswer, opmap: OperatingMap) -> str | None:
    if found.status == "plain_decoding":
        return "plain decoding is best"
    if found.status in ("tie", "no_difference") and any(opmap.is_baseline(a) for a in found.best):
        return "no arm beats plain decoding"
    return None


def off_bands(opmap: OperatingMap, answers: Sequence[BandAnswer]) -> list[OffBand]:
    return [
        OffBand(a.band_index, a.band, a.hardware, how)
        for a in answers
        if a.measure == opmap.measure and (how := _is_off(a, opmap)) is not None
    ]


def _beats_plain(found: BandAnswer, opmap: OperatingMap) -> bool:
    """An arm beats plain decoding here: a best arm (or tie of arms) that is not the baseline, and the baseline had
    enough requests to be judged (else the best arm was only compared with other speculative arms)."""
    if found.status not in ("best", "tie") or any(opmap.is_baseline(a) for a in found.best):
        return False
    bases = {opmap.baselines.get(a, opmap.baseline) for a in found.best}
    cells = [cell_or_none(opmap, found.band, b) for b in bases]
    return all(c is not None and c.requests >= opmap.settings.min_requests for c in cells)


def _where(opmap: OperatingMap) -> str:
    return "by batch size" if opmap.measure == "batch_size" else "by offered rate"


def _unit(opmap: OperatingMap) -> str:
    return "" if opmap.measure == "batch_size" else " req/s"


def off_sentence(opmap: OperatingMap, answers: Sequence[BandAnswer]) -> str:
    """Where speculation should be off, in words, for one map: only what the bands' verdicts support."""
    mine = [a for a in answers if a.measure == opmap.measure]
    found = off_bands(opmap, answers)
    hardware = {a.hardware for a in mine}
    if found:
        parts = [
            f"{o.band}{_unit(opmap)}" + (f" on {o.hardware}" if len(hardware) > 1 else "") + f" ({o.how})"
            for o in found
        ]
        return f"{_where(opmap)}: speculation should be off here: {'; '.join(parts)}"
    helped = [a for a in mine if _beats_plain(a, opmap)]
    if not helped:
        return f"{_where(opmap)}: no band has a verdict against plain decoding: whether to turn speculation off is open"
    on = f" on {', '.join(sorted(hardware))}" if len(hardware) > 1 else ""
    bands = {a.band for a in mine}
    if len(helped) == len(mine):
        return (
            f"{_where(opmap)}: speculation should be off nowhere measured: an arm beats plain decoding in all "
            f"{len(bands)} band{'s' if len(bands) != 1 else ''}{on}"
        )
    unknown = [a for a in mine if a not in helped]
    named = "; ".join(f"{a.band}{_unit(opmap)}" + (f" on {a.hardware}" if on else "") for a in unknown[:3])
    more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
    have = "has" if len(unknown) == 1 else "have"
    return (
        f"{_where(opmap)}: no band calls for speculation off: an arm beats plain decoding in every band{on} except "
        f"{named}{more}, which {have} no verdict against plain decoding"
    )


@dataclass(frozen=True)
class ArmMarks:
    """What the picture marks on an arm: it did not run as configured (why), or is compared per engine."""

    not_as_configured: Mapping[str, str]  # arm -> the checks that failed
    exempt: Collection[str] = ()


def per_engine(opmap: OperatingMap, arm: str) -> bool:
    """Compared with a baseline on other hardware (per engine): not an equal-hardware comparison."""
    return any(c.arm == arm and c.speedup is not None and c.speedup.engines_ratio != 1 for c in opmap.cells)


def _arms(maps: Sequence[OperatingMap]) -> list[str]:
    seen: list[str] = []
    for opmap in maps:
        seen += [a for a in opmap.arms if not opmap.is_baseline(a) and a not in seen]
    return seen


def _colour(maps: Sequence[OperatingMap], arm: str) -> str:
    """The arm's colour in the band charts (its place among every arm of the map, baselines included)."""
    every = list(dict.fromkeys(a for m in maps for a in m.arms))
    return PALETTE[every.index(arm) % len(PALETTE)]


def _panel(svg: Svg, opmap: OperatingMap, x0: float, width: float, arms: list[str], marks: ArmMarks,
           answers: Sequence[BandAnswer], colours: Mapping[str, str]) -> None:  # fmt: skip
    n = len(opmap.bands)
    points = {
        (arm, i): cell.speedup
        for arm in arms
        for i, band in enumerate(opmap.bands)
        if (cell := cell_or_none(opmap, band.label, arm)) is not None and cell.speedup is not None
        and cell.speedup.deciding.point is not None
    }  # fmt: skip
    shown = [s.deciding.point for s in points.values()] + [
        s.deciding.high for s in points.values() if s.deciding.high is not None
    ]
    finite = [v for v in shown if v is not None and math.isfinite(v)]
    # An interval that runs off to many times the largest point (a few requests) is clipped, not the scale.
    largest = max([1.0, *(s.deciding.point for s in points.values() if s.deciding.point is not None)])
    y_ticks = ticks(min(max([1.0, *finite]), 2 * largest) * 1.05)
    frame = Frame(x0 + 52, 46, width - 66, 210, -0.5, n - 0.5, 0.0, y_ticks[-1])
    svg.text(x0 + 4, 16, f"speedup over plain decoding, {_where(opmap)} ({opmap.unit})", font_size=13,
             font_weight="600", fill="#222")  # fmt: skip
    hardware = {a.hardware for a in answers if a.measure == opmap.measure}
    for off in off_bands(opmap, answers):
        left, right = frame.x(off.band_index - 0.5), frame.x(off.band_index + 0.5)
        svg.rect(left, frame.top, right - left, frame.height, f"{off.band}: {off.how} ({off.hardware})",
                 fill=OFF_FILL, class_="off-band")  # fmt: skip
        label = "speculation off" + (f" ({off.hardware})" if len(hardware) > 1 else "")
        svg.text((left + right) / 2, frame.top - 6, label, font_size=10, text_anchor="middle", fill="#b42318")
    for tick in y_ticks:
        y = frame.y(tick)
        svg.line(frame.left, y, frame.right, y, stroke="#eee")
        svg.text(frame.left - 6, y + 4, tick_label(tick), font_size=10, text_anchor="end", fill="#444")
    svg.line(frame.left, frame.top, frame.left, frame.bottom, stroke="#666")
    svg.line(frame.left, frame.bottom, frame.right, frame.bottom, stroke="#666")
    one = frame.y(1.0)
    svg.line(frame.left, one, frame.right, one, stroke="#333", stroke_width=1.2, stroke_dasharray="6 4")
    svg.text(frame.left + 4, one + 13, "1 = plain decoding", font_size=10, fill="#333")
    for i, band in enumerate(opmap.bands):
        svg.text(frame.x(i), frame.bottom + 16, band.label, font_size=10, text_anchor="middle", fill="#444")
    svg.text(frame.left + frame.width / 2, frame.bottom + 34, f"load: {opmap.unit}", font_size=11,
             text_anchor="middle", fill="#333")  # fmt: skip
    ly = frame.top + frame.height / 2
    svg.text(x0 + 14, ly, "speedup (x)", font_size=11, text_anchor="middle", fill="#333",
             transform=f"rotate(-90 {coord(x0 + 14)} {coord(ly)})")  # fmt: skip
    if not points:
        no_data(svg, frame)
    step = min(0.12, 0.6 / max(len(arms), 1))
    for j, arm in enumerate(arms):
        colour = colours[arm]
        hollow = arm in marks.not_as_configured
        dx = (j - (len(arms) - 1) / 2) * step
        line: list[tuple[float, float]] = []
        for i in range(n):
            s = points.get((arm, i))
            if s is None:
                if len(line) > 1:
                    svg.polyline(line, stroke=colour, stroke_width=1.5, stroke_dasharray="4 3" if hollow else None)
                line = []
                continue
            r = s.deciding
            assert r.point is not None
            x, y = frame.x(i + dx), frame.y(min(r.point, frame.y1))
            line.append((x, y))
            faded = "0.35" if s.verdict in (Verdict.INSUFFICIENT_DATA, Verdict.INCONCLUSIVE) else None
            if r.low is not None and r.high is not None:
                top, bottom = frame.y(min(r.high, frame.y1)), frame.y(max(r.low, 0.0))
                svg.line(x, top, x, bottom, stroke=colour, stroke_width=1.5, opacity=faded)
                svg.line(x - 3, top, x + 3, top, stroke=colour, stroke_width=1.5, opacity=faded)
                svg.line(x - 3, bottom, x + 3, bottom, stroke=colour, stroke_width=1.5, opacity=faded)
            tip = (
                f"{arm} @ {opmap.bands[i].label}: {deciding_label(s)} {ci(r)}, {s.verdict.value.replace('_', ' ')}"
                + (" (did not run as configured)" if hollow else "")
            )
            svg.add("circle", f"<title>{esc(tip)}</title>", cx=coord(x), cy=coord(y), r="4.5",
                    fill="#fff" if hollow else colour, stroke=colour, stroke_width="2", opacity=faded)  # fmt: skip
        if len(line) > 1:
            svg.polyline(line, stroke=colour, stroke_width=1.5, stroke_dasharray="4 3" if hollow else None)


def overview_chart(maps: Sequence[OperatingMap], answers: Sequence[BandAnswer], marks: ArmMarks) -> str:
    """One SVG, one panel per operating map (offered rate first: load as the operator sets it)."""
    ordered = sorted(maps, key=lambda m: m.measure != "offered_rate")
    arms = _arms(ordered)
    svg = Svg(WIDTH, 300, "speedup against load per arm, with intervals; shaded: speculation should be off")
    gap = 24.0
    width = (WIDTH - gap * (len(ordered) - 1)) / max(len(ordered), 1)
    for p, opmap in enumerate(ordered):
        _panel(svg, opmap, p * (width + gap), width, arms, marks, answers, {a: _colour(maps, a) for a in arms})
    return svg.render()


def _swatch(colour: str, hollow: bool) -> str:
    dash = ' stroke-dasharray="4 3"' if hollow else ""
    fill = "#fff" if hollow else colour
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="30" height="12" viewBox="0 0 30 12" aria-hidden="true">'
        f'<line x1="1" y1="6" x2="29" y2="6" stroke="{colour}" stroke-width="1.5"{dash}/>'
        f'<circle cx="15" cy="6" r="4" fill="{fill}" stroke="{colour}" stroke-width="2"/></svg>'
    )


def legend_html(maps: Sequence[OperatingMap], marks: ArmMarks) -> str:
    ordered = sorted(maps, key=lambda m: m.measure != "offered_rate")
    items = []
    for arm in _arms(ordered):
        notes = []
        bases = sorted({m.baselines.get(arm, m.baseline) for m in ordered if arm in m.arms})
        notes.append(f"vs {', '.join(bases)}")
        if any(per_engine(m, arm) for m in ordered):
            notes.append("per engine: not on equal hardware")
        if arm in marks.not_as_configured:
            exempt = ", exempt" if arm in marks.exempt else ""
            notes.append(f"hollow: did not run as configured ({marks.not_as_configured[arm]}{exempt})")
        items.append(f"<span>{_swatch(_colour(maps, arm), arm in marks.not_as_configured)} <b>{esc(arm)}</b> "
                     f'<span class="muted">{esc("; ".join(notes))}</span></span>')  # fmt: skip
    items.append(
        '<span><svg xmlns="http://www.w3.org/2000/svg" width="22" height="12" viewBox="0 0 22 12" aria-hidden="true">'
        f'<rect width="22" height="12" fill="{OFF_FILL}"/></svg>'
        " shaded: speculation should be off (plain decoding best, or no arm beats it)</span>"
    )
    items.append('<span class="muted">bars: the interval of the ratio that decided each verdict; faded: no verdict'
                 "</span>")  # fmt: skip
    return f'<div class="legend">{"".join(items)}</div>'
