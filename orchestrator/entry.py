"""The `specdrill` console script. The CLI's imports take seconds (Ray, DuckDB, pyarrow, numba) before its own
signal handling starts (orchestrator/cli/__init__.py `main`); a Ctrl-C in that time is one line and exit 130 here, as
anywhere later, not a KeyboardInterrupt traceback. Nothing heavy is imported at this module's top."""

from __future__ import annotations

import sys

INTERRUPTED = "specdrill: interrupted (SIGINT)\n"


def main() -> None:
    try:
        from orchestrator.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:  # before cli.main's handlers were installed, or after they were restored
        sys.stderr.write(INTERRUPTED)
        sys.exit(130)
