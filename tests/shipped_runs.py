"""A shipped campaign simulated once per test session and shared by the modules that read its run directory
(the verifier's, recommend's): each would otherwise spend the same ~15 s simulating it. The run is made by
`specdrill simulate` as an operator makes it, under a lock, in a folder every xdist worker of this session sees
(not across sessions: the code under test may have changed). Readers must not change it: a test that plants a
fault or writes a file copies it first (`copy_of`)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli


def _session_folder(factory: pytest.TempPathFactory) -> Path:
    base = factory.getbasetemp()
    # Under xdist each worker's base is <session>/popen-gwN: the session's folder is its parent
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shipped_run(factory: pytest.TempPathFactory, campaign: Path) -> tuple[Path, dict]:
    """The run directory of `specdrill simulate CAMPAIGN` (exit 0) and its summary.json."""
    root = _session_folder(factory) / "shipped-runs"
    root.mkdir(exist_ok=True)
    out = root / campaign.stem
    with (root / f"{campaign.stem}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out / "summary.json").exists():
            shutil.rmtree(out, ignore_errors=True)  # a worker that died mid-run left a partial one
            result = CliRunner().invoke(cli, ["simulate", str(campaign), "--output", str(out)])
            assert result.exit_code == 0, result.output
    return out, json.loads((out / "summary.json").read_text())


def copy_of(run: Path, into: Path) -> Path:
    """A private copy of a shared run, to change."""
    shutil.copytree(run, into)
    return into
