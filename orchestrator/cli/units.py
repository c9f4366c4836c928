"""The lines `run` and `simulate CAMPAIGN` print while a campaign's units run (a bar as well on a terminal), and
what they say when a signal stops them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import click
from rich.progress import Progress

from orchestrator.cli.common import console
from orchestrator.execute.progress import CampaignProgress
from orchestrator.execute.runner import OnUnit
from orchestrator.plan.campaign import Campaign
from orchestrator.rundir.layout import RunStore, Unit, UnitResult


def with_unit_lines(
    campaign: Campaign, resume: str, execute: Callable[[OnUnit], tuple[RunStore, dict[str, Any]]], *, virtual: bool
) -> tuple[RunStore, dict[str, Any]]:
    """Run the campaign's pending units with a line per unit (a bar as well on a terminal); on SIGINT or SIGTERM
    say how many units are complete and the command that resumes, and exit 128 + the signal's number."""
    from orchestrator.execute.interrupts import Stopped, stop_on_signals
    from orchestrator.rundir.manifest import units_of

    units = [u for arm in campaign.arms() for u in units_of(campaign, arm)]
    existing = RunStore.existing(campaign.output_dir())
    state = CampaignProgress(
        name=campaign.name, output=campaign.output_dir(), units=units, virtual=virtual,
        complete_before=[u for u in units if existing.is_complete(u)] if existing else [],
    )  # fmt: skip
    bar = _unit_progress(campaign.name, len(units), len(state.complete_before)) if sys.stdout.isatty() else None
    announced = [False]

    def say(line: str) -> None:
        if bar is not None:
            bar.console.print(line, markup=False, highlight=False)
        else:
            click.echo(line)  # flushed: a file, a pipe or a Ray job's log shows it as it happens

    def announce() -> None:
        if not announced[0]:
            announced[0] = True
            for line in state.resumed_lines():
                say(line)

    def on_unit(unit: Unit, event: str, result: UnitResult | None) -> None:
        announce()  # the first unit runs: the run directory was accepted, so it is really being resumed
        say(state.unit_event(unit, event, result))
        if bar is not None:
            bar.update(bar.task_ids[0], description=f"{unit.arm} / {unit.shape} / repeat {unit.repeat}",
                       completed=state.started - (result is None))  # fmt: skip

    def stopped_lines(stopped: Stopped) -> None:
        now = RunStore.existing(campaign.output_dir())
        complete = {u.key for u in units if now.is_complete(u)} if now else set()
        for line in state.interrupted_lines(stopped.name, complete, resume):
            click.echo(line, err=True)

    try:
        with stop_on_signals(stopped_lines), bar if bar is not None else nullcontext():
            store, manifest = execute(on_unit)
            announce()
            if bar is not None:
                bar.update(bar.task_ids[0], completed=len(units), description=f"campaign {campaign.name}")
    except Stopped as stopped:  # said already; the arm and the load workers are stopped by now
        sys.exit(stopped.exit_code)
    return store, manifest


def _unit_progress(name: str, total: int, done: int) -> Progress:
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} units"),
        TimeElapsedColumn(), console=console(), transient=False,
    )  # fmt: skip
    progress.add_task(f"campaign {name}", total=total, completed=done)
    return progress
