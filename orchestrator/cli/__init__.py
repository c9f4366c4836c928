"""The `specdrill` command line: the group, its commands (one module per command group) and `main`, which turns
usage errors, bad files and signals into one line and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from loadshapes.badfile import BadFileError
from orchestrator.cli.calibrate import calibrate_cmd
from orchestrator.cli.common import EXIT_USAGE
from orchestrator.cli.compare import compare_cmd
from orchestrator.cli.decide import recommend_cmd, search_cmd, tune_cmd
from orchestrator.cli.deploy import deploy_cmd, models, teardown_cmd
from orchestrator.cli.report import report_cmd
from orchestrator.cli.run import run_cmd
from orchestrator.cli.simulate import simulate
from orchestrator.logs import configure_logging


@click.group()
@click.version_option(package_name="specdrill", prog_name="specdrill")
@click.option("--log-level", default="WARNING", show_default=True, help="structlog level")
def cli(log_level: str) -> None:
    """specdrill: rehearse speculative-decoding policies under load."""
    configure_logging(log_level)


for _command in (simulate, deploy_cmd, teardown_cmd, run_cmd, report_cmd, recommend_cmd, tune_cmd, search_cmd,
                 models, calibrate_cmd, compare_cmd):  # fmt: skip
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # a file or a pipe gets each line as it is printed
    import signal

    from orchestrator.execute.interrupts import SIGNALS, Stopped, stop_on_signals

    try:
        # Ctrl-C or SIGTERM anywhere (a report's DuckDB query included, which turns it into its own error): one
        # line and 128 + the signal's number, as a campaign's units say it (they say more: how far they got).
        with stop_on_signals():
            cli.main(args=list(argv) if argv is not None else None, prog_name="specdrill", standalone_mode=False)
    except Stopped as stopped:
        click.echo(f"specdrill: interrupted ({stopped.name})", err=True)
        sys.exit(stopped.exit_code)
    except click.UsageError as exc:
        click.echo(f"specdrill: error: {exc.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except BadFileError as exc:  # a file a command read or wrote, named with what is wrong with it
        click.echo(f"specdrill: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        click.echo(f"specdrill: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:  # Ctrl-C outside a campaign's units (those say how far they got)
        click.echo("specdrill: interrupted", err=True)
        sys.exit(130)
    finally:
        if argv is None:  # the process's own command, done: a signal now would only print a traceback on exit
            for signum in SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
