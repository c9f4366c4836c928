"""`specdrill compare` on the console: the answer, the gate, the set-up, what moved, and the cells that changed."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from orchestrator.compare.model import Comparison

_COLOUR = {"better": "green", "worse": "red", "no_change": "default", "not_comparable": "yellow"}


def print_comparison(comparison: Comparison, console: Console) -> None:
    plain = {"markup": False, "highlight": False, "soft_wrap": True}
    console.print(comparison.answer, **plain)  # type: ignore[arg-type]
    if comparison.setup:
        table = Table(title="set-up differences")
        for column in ("what", "arm", "baseline", "candidate"):
            table.add_column(column)
        for d in comparison.setup:
            table.add_row(d.what, d.arm or "run", d.baseline, d.candidate)
        console.print(table)
    table = Table(title=f"bands and arms (candidate / baseline, > 1 favours the candidate; {comparison.traffic})")
    for column in ("band", "arm", "n (baseline/candidate)", "per-token", "goodput", "verdict"):
        table.add_column(column)
    for c in comparison.cells:

        def text(r: object) -> str:
            point, low, high = (getattr(r, k) for k in ("point", "low", "high"))
            if point is None:
                return "-"
            return f"{point:.2f}x" + ("" if low is None or high is None else f" [{low:.2f},{high:.2f}]")

        band = f"batch {c.band}" if c.measure == "batch_size" else f"{c.band} req/s"
        colour = _COLOUR[c.verdict]
        n = f"{c.pairs} pairs" if c.paired else f"{c.baseline.requests}/{c.candidate.requests}"
        said = f"[{colour}]{c.verdict.replace('_', ' ')}[/{colour}]"
        table.add_row(band, c.arm, n, text(c.tpot), text(c.goodput), said)
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
    if comparison.fail_on:
        if comparison.gate_failures:
            console.print(f"[red]gate failed[/red] (--fail-on {', '.join(comparison.fail_on)}):")
            for line in comparison.gate_failures:
                console.print(f"  {line}", **plain)  # type: ignore[arg-type]
        else:
            console.print(f"[green]gate passed[/green] (--fail-on {', '.join(comparison.fail_on)})")
