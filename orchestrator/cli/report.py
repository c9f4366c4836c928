"""`specdrill report`: the operating map and verdict of a run."""

from __future__ import annotations

import sys

import click
from rich.console import Console


@click.command("report")
@click.argument("run_dir")
@click.option("--no-gate-exit", is_flag=True, help="exit 0 even when a gate fails (the report still says so)")
def report_cmd(run_dir: str, no_gate_exit: bool) -> None:
    """The operating map and executed-policy verdict of a run: terminal tables, report.html, summary.json."""
    from orchestrator.report.build import EXIT_GATE_FAILED, write_report

    summary = write_report(run_dir, console=Console(width=200))
    if not summary.passed and not no_gate_exit:
        sys.exit(EXIT_GATE_FAILED)
