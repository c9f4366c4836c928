"""`specdrill compare`: what moved between two runs, and a release gate on it."""

from __future__ import annotations

import os
import sys

import click

from orchestrator.cli.common import console, fail, output_directory

# orchestrator/compare/answer.py's FAIL_ON, written out: the command line imports no analysis until it runs
FAIL_ON = ("worse", "engine-slower", "verdict-change", "policy-change", "any")


@click.command("compare")
@click.argument("baseline_run")
@click.argument("candidate_run")
@click.option("--arm", "arms", multiple=True, help="only this arm (repeatable; default: every arm both runs ran)")
@click.option(
    "-o", "--output", default=None, help="directory for compare.json and compare.html (default: CANDIDATE_RUN)"
)
@click.option("--fail-on", "fail_on", multiple=True, type=click.Choice(list(FAIL_ON)),
              help="exit 3 when speculation's benefit (an arm's speedup over off) fell (worse), plain decoding got "
                   "slower (engine-slower), a verdict changed beyond the intervals, or the executed policy changed "
                   "(repeatable)")  # fmt: skip
@click.option("--margin", type=click.FloatRange(0, 1), default=None,
              help="a change within this fraction is no change (default: the baseline map's margin)")  # fmt: skip
@click.option(
    "--allow-different-traffic",
    is_flag=True,
    help="let --fail-on judge runs that sent different traffic (seed, shapes, mix...; else exit 2)",
)
def compare_cmd(
    baseline_run: str, candidate_run: str, arms: tuple[str, ...], output: str | None, fail_on: tuple[str, ...],
    margin: float | None, allow_different_traffic: bool,
) -> None:  # fmt: skip
    """What changed between BASELINE_RUN and CANDIDATE_RUN (both reported): set-up, per band and arm the change
    with an interval, verdict changes, crossover moves, executed-policy changes; compare.json and compare.html."""
    from orchestrator.compare.build import NotComparable, compare
    from orchestrator.compare.console import print_comparison
    from orchestrator.compare.write import write_comparison
    from orchestrator.report.build import EXIT_GATE_FAILED

    if output is not None:
        output_directory(output, "compare output")
    try:
        comparison = compare(
            baseline_run, candidate_run, arms=arms, fail_on=fail_on, margin=margin,  # type: ignore[arg-type]
            allow_different_traffic=allow_different_traffic,
        )  # fmt: skip
    except NotComparable as exc:
        fail(str(exc))
        raise
    out = console()
    print_comparison(comparison, out)
    where = write_comparison(comparison, output if output is not None else candidate_run)
    out.print(f"compare: {os.path.join(where, 'compare.html')}  {os.path.join(where, 'compare.json')}",
              markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    if comparison.gate_failures:
        sys.exit(EXIT_GATE_FAILED)
