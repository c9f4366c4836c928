"""`specdrill compare` on the console: the answer, the gate, speculation's benefit, the set-up, every arm's own
cells, and what moved."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from orchestrator.analysis.opmap.results import RatioCI
from orchestrator.compare.model import Comparison

_COLOUR = {"better": "green", "worse": "red", "no_change": "default", "not_comparable": "yellow"}


def _text(r: RatioCI | None) -> str:
    if r is None or r.point is None:
        return "-"
    return f"{r.point:.2f}x" + ("" if r.low is None or r.high is None else f" [{r.low:.2f},{r.high:.2f}]")


def _band(measure: str, band: str) -> str:
    return f"batch {band}" if measure == "batch_size" else f"{band} req/s"


def _gate(comparison: Comparison, console: Console) -> None:
    """The gate under the answer: one line per reason, grouped by arm (compare/answer.py gate_failures)."""
    if not comparison.fail_on:
        return
    gates = ", ".join(comparison.fail_on)
    if not comparison.gate_failures:
        console.print(f"[green]gate passed[/green] (--fail-on {gates})")
        return
    console.print(f"[red]gate failed[/red] (--fail-on {gates}):")
    for line in comparison.gate_failures:
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)


def print_comparison(comparison: Comparison, console: Console) -> None:
    plain = {"markup": False, "highlight": False, "soft_wrap": True}
    console.print(comparison.answer, **plain)  # type: ignore[arg-type]
    _gate(comparison, console)
    if comparison.benefit_changes:
        benefit = Table(title="speculation's benefit: each arm's speedup over off (> 1: speculation gained)")
        for column in ("band", "arm", "ratio", "baseline", "candidate", "candidate / baseline", "verdict"):
            benefit.add_column(column)
        for b in comparison.benefit_changes:
            colour = _COLOUR[b.verdict]
            benefit.add_row(_band(b.measure, b.band), b.arm, b.ratio, _text(b.baseline), _text(b.candidate),
                            _text(b.change), f"[{colour}]{b.verdict.replace('_', ' ')}[/{colour}]")  # fmt: skip
        console.print(benefit)
    if comparison.setup:
        table = Table(title="set-up differences")
        for column in ("what", "arm", "baseline", "candidate"):
            table.add_column(column)
        for d in comparison.setup:
            table.add_row(d.what, d.arm or "run", d.baseline, d.candidate)
        console.print(table)
    table = Table(title=f"every arm's own cells (candidate / baseline, > 1 favours the candidate; "
                        f"{comparison.traffic})")  # fmt: skip
    for column in ("band", "arm", "n (baseline/candidate)", "per-token", "goodput", "verdict"):
        table.add_column(column)
    for c in comparison.cells:
        colour = _COLOUR[c.verdict]
        n = f"{c.pairs} pairs" if c.paired else f"{c.baseline.requests}/{c.candidate.requests}"
        said = f"[{colour}]{c.verdict.replace('_', ' ')}[/{colour}]"
        table.add_row(_band(c.measure, c.band), c.arm, n, _text(c.tpot), _text(c.goodput), said)
    console.print(table)
    for title, lines in (
        ("verdict changes", [v.message for v in comparison.verdict_changes]),
        ("crossover moves", [m.message for m in comparison.crossover_moves]),
        ("executed-policy changes", [p.message for p in comparison.policy_changes]),
        ("recommended schedule (specdrill recommend)", comparison.recommended),
    ):
        console.print(f"[bold]{title}[/bold]: {'none' if not lines else ''}")
        for line in lines:
            console.print(f"  {line}", **plain)  # type: ignore[arg-type]
