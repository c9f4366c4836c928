"""`specdrill report RUN_DIR`: the operating map, the executed-policy verdict, report.html and summary.json."""

from __future__ import annotations


def report_and_exit(run_dir: str) -> None:
    raise NotImplementedError(run_dir)
