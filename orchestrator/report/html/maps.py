"""An operating map's section of report.html: the band-by-arm table, its heatmap and band charts, crossovers."""

from __future__ import annotations

from collections.abc import Callable

from loadshapes.slo import SloConfig
from orchestrator.analysis.opmap.measures import MEASURES
from orchestrator.analysis.opmap.results import MapCell, OperatingMap, Quantiles
from orchestrator.report.html.charts import band_chart, band_series, cell_or_none, coinciding, heatmap
from orchestrator.report.html.overview import ArmMarks, per_engine
from orchestrator.report.html.text import ci, dur, esc, figure, num, pct, verdict


def _quantiles(q: Quantiles, *names: str) -> str:
    return " / ".join(dur(getattr(q, n)) for n in names)


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
        f"n {cell.requests}, done {cell.completed}, errors {pct(cell.error_rate)}",
        f"throughput {num(cell.throughput_rps)} rps, goodput {num(cell.goodput_rps)} rps",
        *(f"{m.label} {'/'.join(m.html)} {_quantiles(cell.measure(m.name), *m.html)}" for m in MEASURES if m.html),
        f"mean executed k {num(cell.mean_executed_k)}",
    ]
    out = "".join(f"<div>{esc(line)}</div>" for line in lines)
    if baseline or cell.speedup is None:
        return out + '<div class="muted">baseline</div>'
    s = cell.speedup
    goodput = "goodput ratio per engine" if s.engines_ratio != 1 else "goodput ratio"
    # Said once, on the verdict's line: which ratio's interval decided it (both, or neither, included)
    decided = {"both": "both ratios", "neither": "neither ratio (too few data)"}.get(s.decided_by, s.decided_by)
    return (
        out
        + f"<div>TPOT speedup {esc(ci(s.tpot))}</div>"
        + f"<div>{goodput} {esc(ci(s.goodput))}</div>"
        + f'<div>{verdict(s.verdict)} (decided by {esc(decided)}) <span class="muted">'
        + f"{'paired' if s.paired else 'unpaired'}, {s.pairs} pairs</span></div>"
    )


def _knobs_html(opmap: OperatingMap, arm: str) -> str:
    """The arm's speculation knobs not at vLLM's defaults (rejection sampling, lm_head quantization, prefill
    interval), under its name."""
    knobs = opmap.knobs.get(arm)
    return f'<div class="muted">{esc(knobs)}</div>' if knobs else ""


def _map_table(opmap: OperatingMap) -> str:
    head = "".join(
        f"<th>{esc(arm)}{' (baseline)' if opmap.is_baseline(arm) else ''}{_knobs_html(opmap, arm)}</th>"
        for arm in opmap.arms
    )
    rows = []
    for band in opmap.bands:
        cells = "".join(
            f'<td class="cell">{_cell_html(cell_or_none(opmap, band.label, arm), opmap.is_baseline(arm))}</td>'
            for arm in opmap.arms
        )
        rows.append(f"<tr><th>{esc(band.label)}</th>{cells}</tr>")
    return (
        f"<table><thead><tr><th>band ({esc(opmap.unit)})</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _crossovers(opmap: OperatingMap) -> str:
    if not opmap.crossovers:
        return ""
    said = " \u00b7 ".join(c.message for c in opmap.crossovers)
    return f'<p class="meta"><b>crossovers</b>: {esc(said)}</p>'


def _tpot_ms(cell: MapCell) -> float | None:
    p50 = cell.measure("tpot_s").p50
    return None if p50 is None else p50 * 1000


def _seconds(value: float) -> str:
    return f"{value * 1000:g} ms" if value < 1 else f"{value:g} s"


def slo_text(slo: SloConfig | None) -> str:
    """The deadlines goodput counts against, as the charts' captions say them."""
    if slo is None:
        return "the campaign's SLO"
    names = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "end-to-end"))
    deadlines = [f"{label} \u2264 {_seconds(getattr(slo, name))}" for name, label in names if getattr(slo, name)]
    text = ", ".join(deadlines) or "no deadline"
    if slo.per_category:
        text += f" (other deadlines for {', '.join(sorted(slo.per_category))})"
    return text


def _coincide_note(opmap: OperatingMap, value: Callable[[MapCell], float | None]) -> str:
    groups = coinciding(band_series(opmap, value))
    return "".join(f"; lines coincide: {' and '.join(g)} (drawn over one another)" for g in groups)


def _band_figures(opmap: OperatingMap, slo: SloConfig | None) -> str:
    goodput_caption = f"goodput per band: completed requests per second within the SLO ({slo_text(slo)})"
    tpot_threshold = None
    tpot_caption = "median time per output token per band"
    if slo is not None and slo.tpot_s is not None:
        tpot_threshold = (slo.tpot_s * 1000, f"SLO TPOT {_seconds(slo.tpot_s)}")
        tpot_caption += f"; dashed red: the SLO's TPOT deadline {_seconds(slo.tpot_s)} (a request's own TPOT)"
    return (
        figure(
            band_chart(opmap, "goodput (req/s)", lambda c: c.goodput_rps),
            goodput_caption + _coincide_note(opmap, lambda c: c.goodput_rps),
        )
        + figure(band_chart(opmap, "TPOT p50 (ms)", _tpot_ms, tpot_threshold), tpot_caption
                 + _coincide_note(opmap, _tpot_ms))
    )  # fmt: skip


def map_section(opmap: OperatingMap, index: int, slo: SloConfig | None = None, marks: ArmMarks | None = None) -> str:
    """The heatmap and the band charts first; the per-cell table (every figure) folded below them."""
    s = opmap.settings
    unbanded = ", ".join(f"{esc(a)} {n}" for a, n in opmap.unbanded.items() if n) or "none"
    marked = marks.not_as_configured if marks is not None else {}
    unequal = [a for a in opmap.arms if per_engine(opmap, a)]
    notes = []
    if marked:
        notes.append("hatched (\u26a0): did not run as configured")
    if unequal:
        notes.append("\u2260: per engine, not on equal hardware")
    return (
        f"<section><h2>Operating map {index + 1}: by {esc(opmap.measure.replace('_', ' '))} ({esc(opmap.unit)})</h2>"
        f'<p class="meta">baselines <b>{esc(_baselines(opmap))}</b> &middot; confidence {s.confidence:g}, '
        f"margin {s.margin:g}, {s.bootstrap_samples} bootstrap samples, at least {s.min_requests} requests per "
        f"cell &middot; requests outside every band: {unbanded}</p>"
        + figure(
            heatmap(opmap, marked, unequal),
            "per cell, the ratio over the arm's baseline that decided its verdict: tpot (the baseline's per-token "
            "latency / the arm's) or goodput (the arm's / the baseline's, per engine where the hardware differs; "
            f"within the SLO: {slo_text(slo)})" + "".join(f"; {n}" for n in notes),
        )
        + f'<div class="row">{_band_figures(opmap, slo)}</div>'
        + _crossovers(opmap)
        + "<details><summary>every figure per band and arm (n, throughput, goodput, TTFT, TPOT, queue wait, k, "
        f"ratios)</summary>{_map_table(opmap)}</details></section>"
    )
