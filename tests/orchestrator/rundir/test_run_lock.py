"""One writer per run directory (orchestrator/rundir/lock.py): a live holder refuses a second writer in one line
naming it, a dead holder's lock is named and taken over, another host's lock is refused unless --force-lock, an
unreadable lock is named; a non-empty --output that is not a run is refused before anything is written. Two
real concurrent `simulate` processes are in tests/orchestrator/cli/test_corrupt_run_fuzz.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.rundir.lock import LOCK, LockRecord, process_start
from tests.tiny_campaigns import as_yaml, cli_exit, sim_campaign

CAMPAIGN = as_yaml(sim_campaign(
    "locked", policies={"off": "off", "k2": "fixed:2"}, shapes={"calm": {"kind": "quiet", "rate": 2, "duration_s": 3}},
    load={"drain_s": 3},
))  # fmt: skip


cli = cli_exit


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lock(run: Path, *, pid: int, host: str, start: int | None = None) -> LockRecord:
    record = LockRecord(pid=pid, host=host, started="2026-01-02T03:04:05Z", process_start=start,
                        command="specdrill simulate other.yaml", token="t" * 32)  # fmt: skip
    run.mkdir(parents=True, exist_ok=True)
    (run / LOCK).write_text(record.model_dump_json())
    return record


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    path = tmp_path / "locked.yaml"
    path.write_text(CAMPAIGN)
    return path


def _simulate(capsys: pytest.CaptureFixture[str], campaign: Path, run: Path, *extra: str) -> tuple[int, str]:
    return cli(capsys, "simulate", str(campaign), "--output", str(run), "--no-report", *extra)


def test_a_live_holder_refuses_a_second_writer_in_one_line(
    campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        _lock(run, pid=holder.pid, host=socket.gethostname(), start=process_start(holder.pid))
        code, err = _simulate(capsys, campaign, run)
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and err == (
        f"specdrill: error: {run / LOCK}: another writer holds this run directory: pid {holder.pid} on host "
        f"{socket.gethostname()} since 2026-01-02T03:04:05Z (specdrill simulate other.yaml); wait for it to finish "
        "or use another --output\n"
    )
    assert sorted(p.name for p in run.iterdir()) == [LOCK]  # nothing written, the holder's lock untouched
    assert json.loads((run / LOCK).read_text())["pid"] == holder.pid


@pytest.mark.parametrize("why", ["dead pid", "reused pid"])
def test_a_stale_lock_is_named_and_taken_over(
    why: str, campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    if why == "dead pid":
        pid, start = _dead_pid(), None
    else:  # a running process that started at another time than the lock's: the pid was reused
        pid, start = os.getppid(), (process_start(os.getppid()) or 0) + 1
    _lock(run, pid=pid, host=socket.gethostname(), start=start)
    code, err = _simulate(capsys, campaign, run)
    assert code == 0, err
    assert err == (
        f"specdrill: {run / LOCK}: stale lock (that process is no longer running): pid {pid} on host "
        f"{socket.gethostname()} since 2026-01-02T03:04:05Z (specdrill simulate other.yaml); taken over\n"
    )
    assert not (run / LOCK).exists()  # released when the run finished
    assert len(list((run / "units").rglob("*.json"))) == 2


def test_another_hosts_lock_is_refused_unless_forced(
    campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    _lock(run, pid=os.getpid(), host="elsewhere.example")  # our own pid, but on another host: not ours
    code, err = _simulate(capsys, campaign, run)
    assert code == 2 and err == (
        f"specdrill: error: {run / LOCK}: this run directory is being written from another host: pid {os.getpid()} "
        "on host elsewhere.example since 2026-01-02T03:04:05Z (specdrill simulate other.yaml); if that run is gone, "
        "rerun with --force-lock\n"
    )
    code, err = _simulate(capsys, campaign, run, "--force-lock")
    assert code == 0 and err == (
        f"specdrill: {run / LOCK}: lock of another host, taken over as --force-lock asked: pid {os.getpid()} on host "
        "elsewhere.example since 2026-01-02T03:04:05Z (specdrill simulate other.yaml); taken over\n"
    )
    assert not (run / LOCK).exists()


def test_an_unreadable_lock_is_named(campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text("{not json")
    code, err = _simulate(capsys, campaign, run)
    assert code == 2 and err.startswith(f"specdrill: error: {run / LOCK}: not a specdrill writer lock"), err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["simulate", "search"])
def test_a_non_empty_output_that_is_not_a_run_is_refused(
    command: str, campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "photos"
    out.mkdir()
    for name in ("a.jpg", "b.jpg", "c.jpg", "notes.txt"):
        (out / name).write_text("x")
    before = sorted(p.name for p in out.iterdir())
    if command == "simulate":
        code, err = _simulate(capsys, campaign, out)
    else:
        code, err = cli(capsys, "search", str(campaign), "--arm", "k2", "-o", str(out), "--unit-requests", "20",
                        "--low", "1", "--high", "4")  # fmt: skip
    assert code == 2 and err == (
        f"specdrill: error: {out}: not empty and not a specdrill run directory (no manifest.json; holds a.jpg, b.jpg, "
        "c.jpg and 1 more): give --output a new or empty directory\n"
    ), err
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written, no lock left


def test_an_empty_output_and_a_resumed_run_are_accepted(
    campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "empty"
    run.mkdir()
    assert _simulate(capsys, campaign, run)[0] == 0
    assert _simulate(capsys, campaign, run)[0] == 0  # its own run directory: a resume (nothing left to run)
    assert not (run / LOCK).exists()
