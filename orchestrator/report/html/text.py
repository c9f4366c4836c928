"""Text and HTML fragments of report.html: escaping, numbers with units, verdict marks, lists and tables."""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from orchestrator.analysis.opmap.results import RatioCI, Verdict
from orchestrator.numfmt import fixed

NO_DATA = "\u2013"  # en dash


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def num(value: float | None, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return NO_DATA
    return fixed(value, digits)


def dur(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return NO_DATA
    return f"{fixed(seconds * 1000, 1)} ms" if abs(seconds) < 1 else f"{fixed(seconds, 2)} s"


def pct(value: float | None) -> str:
    return NO_DATA if value is None or not math.isfinite(value) else f"{fixed(100 * value, 1)}%"


def ratio(value: float | None) -> str:
    return NO_DATA if value is None or not math.isfinite(value) else f"{fixed(value, 2)}x"


def ci(interval: RatioCI) -> str:
    return f"{ratio(interval.point)} [{num(interval.low)}, {num(interval.high)}]"


def verdict(value: Verdict) -> str:
    return f'<span class="v v-{esc(value.value)}">{esc(value.value.replace("_", " "))}</span>'


def passfail(passed: bool) -> str:
    return '<span class="ok">pass</span>' if passed else '<span class="bad">FAIL</span>'


def status_mark(status: str | None) -> str:
    """A finding's outcome: pass, FAIL, or not verifiable / not exercised (no evidence either way)."""
    if status in ("not_verifiable", "not_exercised"):
        return f'<span class="unverified">{esc(status.replace("_", " "))}</span>'
    return passfail(status == "pass")


EXEMPT = ' <span class="exempt">(exempt)</span>'  # after an exempt arm's failure: reported, not failed


def badge(passed: bool, text: str, *, kind: str | None = None) -> str:
    """`kind`: the CSS class (pass, fail, partial); from `passed` when not given."""
    return f'<span class="badge {kind or ("pass" if passed else "fail")}">{esc(text)}</span>'


def bullets(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{esc(item)}</li>" for item in items) + "</ul>"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Header cells are escaped here; row cells are HTML already (escape their text before)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def json_code(value: Any) -> str:
    return NO_DATA if value is None else f"<code>{esc(json.dumps(value, sort_keys=True, default=str))}</code>"


_SVG_WIDTH = re.compile(r'^<svg\b[^>]*?\swidth="([0-9.]+)"')


def figure(svg: str, caption: str) -> str:
    """The caption above its chart: below, it read as the next chart's title. As wide as the chart (at most the
    page), so a long caption wraps above it and two charts can stand side by side."""
    found = _SVG_WIDTH.match(svg)
    style = f' style="width:{found.group(1)}px;max-width:100%"' if found else ""
    return f"<figure{style}><figcaption>{esc(caption)}</figcaption>{svg}</figure>"
