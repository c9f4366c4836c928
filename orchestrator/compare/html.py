"""compare.html: one self-contained page (the report's style, no JavaScript) for `specdrill compare`: the
answer first, the gate's reasons grouped under it, speculation's benefit against load (each arm's speedup over
`off`, both runs overlaid, with intervals), the engine's own change, what differs in the set-up, what moved,
then every band and arm of both band sets."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.compare.chart import benefit_chart
from orchestrator.compare.model import BenefitChange, CellChange, Comparison, RunCell
from orchestrator.report.html.page import CSS
from orchestrator.report.html.text import ci, dur, esc, num

_MARK = {
    "better": "v-helps",
    "worse": "v-hurts",
    "no_change": "v-no_difference",
    "not_comparable": "v-insufficient_data",
}


def _run_cell(cell: RunCell) -> str:
    if not cell.requests:
        return '<span class="muted">no requests</span>'
    against = "" if cell.verdict is None or cell.deciding is None else (
        f"<br>vs off: {esc(cell.decided_by or '')} {ci(cell.deciding)} {esc(cell.verdict.replace('_', ' '))}"
    )  # fmt: skip
    good = "-" if cell.goodput_rps is None else f"{num(cell.goodput_rps, 1)}/s"
    return f"n={cell.requests} goodput {good} tpot p50 {dur(cell.tpot_p50_s)}{against}"


def _row(c: CellChange) -> str:
    how = f"paired ({c.pairs})" if c.paired else "unpaired"
    return (
        f"<tr><td>{esc(c.band)}</td><td>{esc(c.arm)}</td><td class=cell>{_run_cell(c.baseline)}</td>"
        f"<td class=cell>{_run_cell(c.candidate)}</td><td class=cell>per-token {ci(c.tpot)}<br>goodput "
        f'{ci(c.goodput)}<br>{how}</td><td><span class="v {_MARK[c.verdict]}">'
        f"{esc(c.verdict.replace('_', ' '))}</span></td></tr>"
    )


def _table(heads: Sequence[str], rows: str) -> str:
    return "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in heads) + f"</tr>{rows}</table>"


def _cells(comparison: Comparison) -> str:
    out = []
    for measure in dict.fromkeys(c.measure for c in comparison.cells):
        rows = "".join(_row(c) for c in comparison.cells if c.measure == measure)
        heads = ("band", "arm", "baseline run", "candidate run", "candidate / baseline (> 1 favours the candidate)",
                 "verdict")  # fmt: skip
        out.append(f"<h3>by {esc(measure.replace('_', ' '))}</h3>{_table(heads, rows)}")
    return "".join(out)


def _benefit(comparison: Comparison) -> str:
    """Per band set, offered rate first (load as the operator sets it): the chart, then its table."""
    if not comparison.benefit_changes:
        return '<p class="muted">no speculative arm compared with its off arm in both runs</p>'
    out = []
    measures = dict.fromkeys(b.measure for b in comparison.benefit_changes)
    for measure in sorted(measures, key=lambda m: m != "offered_rate"):
        found = [b for b in comparison.benefit_changes if b.measure == measure]
        bands = list(dict.fromkeys(c.band for c in sorted(comparison.cells, key=lambda c: c.band_index)
                                   if c.measure == measure))  # fmt: skip
        unit = "req/s" if measure == "offered_rate" else "batch size"
        rows = "".join(_benefit_row(b) for b in found)
        heads = ("band", "arm", "ratio", "baseline run", "candidate run", "candidate / baseline", "verdict")
        out.append(
            f"<h3>by {esc(measure.replace('_', ' '))}</h3>{benefit_chart(found, bands, unit)}{_table(heads, rows)}"
        )
    return "".join(out)


def _benefit_row(b: BenefitChange) -> str:
    said = {"better": "grew", "worse": "fell", "no_change": "unchanged", "not_comparable": "not comparable"}
    noise = "<br><span class=muted>noise can explain it</span>" if b.noise_explains and b.verdict != "not_comparable" \
        else ""  # fmt: skip
    return (
        f"<tr><td>{esc(b.band)}</td><td>{esc(b.arm)}</td><td>{esc(b.ratio)}</td><td>"
        f"{'-' if b.baseline is None else ci(b.baseline)}</td><td>{'-' if b.candidate is None else ci(b.candidate)}"
        f'</td><td>{ci(b.change)}{noise}</td><td><span class="v {_MARK[b.verdict]}">{said[b.verdict]}</span></td></tr>'
    )


def _items(lines: list[str], empty: str) -> str:
    if not lines:
        return f'<p class="muted">{esc(empty)}</p>'
    return "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in lines) + "</ul>"


def render_compare_html(comparison: Comparison) -> str:
    gate = ""
    if comparison.fail_on:
        badge = '<span class="badge fail">gate failed</span>' if comparison.gate_failures else \
            '<span class="badge pass">gate passed</span>'  # fmt: skip
        gate = f"<p>{badge} --fail-on {esc(', '.join(comparison.fail_on))}</p>" + (
            f'<div class="failures">{_items(comparison.gate_failures, "")}</div>' if comparison.gate_failures else ""
        )
    setup = "".join(
        f"<tr><td>{esc(d.what)}</td><td>{esc(d.arm or 'run')}</td><td><code>{esc(d.baseline)}</code></td>"
        f"<td><code>{esc(d.candidate)}</code></td></tr>"
        for d in comparison.setup
    )
    setup_table = (
        f"<table><tr><th>what</th><th>arm</th><th>baseline</th><th>candidate</th></tr>{setup}</table>"
        if setup else '<p class="muted">the same set-up</p>'
    )  # fmt: skip
    body = (
        f"<h1>specdrill compare</h1><p class=meta>baseline {esc(comparison.baseline_run)} "
        f"(<code>{esc(comparison.baseline_dir)}</code>)<br>candidate {esc(comparison.candidate_run)} "
        f"(<code>{esc(comparison.candidate_dir)}</code>)<br>{esc(comparison.traffic)}; margin {comparison.margin:g}"
        f"</p><h2>Answer</h2><p>{esc(comparison.answer)}</p>{gate}"
        f"<h2>Speculation's benefit</h2>{_benefit(comparison)}"
        f"<h2>The engine (plain decoding)</h2>{_items([e.message for e in comparison.engine_changes], 'no off arm')}"
        f"<h2>Set-up</h2>{setup_table}"
        f"<h2>Verdict changes</h2>{_items([v.message for v in comparison.verdict_changes], 'none')}"
        f"<h2>Crossover moves</h2>{_items([m.message for m in comparison.crossover_moves], 'none')}"
        f"<h2>Executed-policy changes</h2>{_items([p.message for p in comparison.policy_changes], 'none')}"
        f"<h2>Recommended schedule</h2>{_items(comparison.recommended, 'none')}"
        f"<h2>Every arm's own cells</h2>{_cells(comparison)}"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>specdrill compare</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
