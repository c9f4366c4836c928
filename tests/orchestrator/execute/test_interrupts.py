"""Ctrl-C and SIGTERM during `specdrill simulate` of a campaign, with a real process and a real signal (issue 25):
it stops without a traceback, leaves the unit in flight incomplete (no marker, no temporary file), says how many
units are complete of how many and the exact command that resumes; the resumed run names the units it skips.
Progress reaches a pipe line by line: the test reads each unit's line while the run is still going."""

from __future__ import annotations

import json
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tiny_campaigns import DYN, as_yaml, sim_campaign, two_shapes

SPECDRILL = [sys.executable, "-c", "from orchestrator.cli import main; main()"]

# Three arms, one shape: units of ~5k requests (a second or more each here), long enough that a signal sent the
# moment a unit's "started" line arrives lands inside that unit.
CAMPAIGN = as_yaml(sim_campaign(
    "cut", policies={"off": "off", "k3": "fixed:3", "dyn": DYN},
    shapes={"steady": {"kind": "sustained", "rate": 40, "duration_s": 120}}, load={"drain_s": 5},
))  # fmt: skip
UNITS = ["off-single/steady/r0", "k3-single/steady/r0", "dyn-single/steady/r0"]
WAIT_S = 300  # bound on every wait: a run that hangs fails the test instead of the suite


def _read_until(proc: subprocess.Popen[str], needle: str) -> list[str]:
    """stdout lines up to and including the first one containing `needle`, read while the process runs."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if needle in line:
            return lines
    raise AssertionError(f"no line with {needle!r} before the run ended; got {lines}")


def _markers(run: Path) -> set[str]:
    return {str(p.relative_to(run / "units").with_suffix("")) for p in (run / "units").rglob("r*.json")}


@pytest.mark.slow  # ~15 s each here: two runs of three 4,800-request units
@pytest.mark.parametrize(("signum", "name", "code"), [(signal.SIGINT, "SIGINT", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_a_signal_stops_the_campaign_cleanly_and_the_rerun_resumes(
    signum: int, name: str, code: int, tmp_path: Path
) -> None:
    campaign = tmp_path / "cut.yaml"
    campaign.write_text(CAMPAIGN)
    run = tmp_path / "run"
    args = ["simulate", str(campaign), "--output", str(run), "--no-report"]
    proc = subprocess.Popen([*SPECDRILL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Through a pipe, each line arrives while the run goes on: the first unit's lines before the second starts.
        before = _read_until(proc, "unit 2/3 arm=k3-single shape=steady repeat=0 started")
        assert proc.poll() is None
        proc.send_signal(signum)
        rest, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert before[0] == "unit 1/3 arm=off-single shape=steady repeat=0 started"
    assert before[1].startswith("unit 1/3 arm=off-single shape=steady repeat=0 finished: requests=")
    assert proc.returncode == code, err
    assert "Traceback" not in err and "unit 2/3 arm=k3-single shape=steady repeat=0 finished" not in rest
    resume = shlex.join(["specdrill", *args])
    assert err.strip().splitlines() == [
        f"specdrill: stopped by {name}: 1 of 3 units complete; unit arm=k3-single shape=steady repeat=0 was in "
        "flight and is not complete (resuming runs it again from its start)",
        f"resume with: {resume}",
    ]
    # Nothing half-written: the unit in flight has no marker, no temporary file anywhere, a readable manifest.
    assert _markers(run) == {"off-single/steady/r0"}
    assert not [p for p in run.rglob(".tmp-*")]
    manifest = json.loads((run / "manifest.json").read_text())
    assert list(manifest["units"]) == ["off-single/steady/r0"] and "finished_ns" not in manifest

    # The report of the stopped run says it is partial, which units are missing and how to resume.
    report = subprocess.run([*SPECDRILL, "report", str(run)], capture_output=True, text=True, timeout=WAIT_S,
                            check=False)  # fmt: skip
    assert report.returncode in (0, 3), report.stderr
    assert report.stdout.splitlines()[0] == (
        "partial run: 1 of 3 units complete (not run: dyn-single/steady/r0, k3-single/steady/r0); the figures cover "
        f"only the complete units: resume with specdrill simulate CAMPAIGN --output {run}"
    )
    assert json.loads((run / "summary.json").read_text())["partial_run"] == report.stdout.splitlines()[0]

    resumed = subprocess.run([*SPECDRILL, *shlex.split(resume)[1:]], capture_output=True, text=True,
                             timeout=WAIT_S, check=False)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    lines = resumed.stdout.splitlines()
    assert lines[:2] == [
        f"campaign cut: resuming in {run}: 1 of 3 units already complete, 2 to run",
        "unit arm=off-single shape=steady repeat=0 skipped: already complete",
    ]
    assert lines[2] == "unit 2/3 arm=k3-single shape=steady repeat=0 started"
    assert lines[4] == "unit 3/3 arm=dyn-single shape=steady repeat=0 started"
    assert _markers(run) == set(UNITS)
    for unit in UNITS:
        marker = json.loads((run / "units" / f"{unit}.json").read_text())
        assert marker["rows"] == marker["scheduled"] > 4000  # the redone unit holds each request once


def test_a_signal_after_the_last_unit_points_to_the_report(tmp_path: Path) -> None:
    """Every unit complete when the signal comes (the last marker written, its line not printed yet): no unit in
    flight, no resume to offer, the report command instead."""
    from orchestrator.execute.progress import CampaignProgress
    from orchestrator.rundir.layout import Unit

    units = [Unit(arm="off-single", shape="s", repeat=0)]
    state = CampaignProgress(name="c", output="runs/my run", units=units, complete_before=units)
    state.unit_event(units[0], "start", None)  # its marker written, the signal before its "finished" line
    assert state.interrupted_lines("SIGTERM", {units[0].key}, "specdrill simulate c.yaml") == [
        "specdrill: stopped by SIGTERM: 1 of 1 units complete",
        "every unit is complete; the report: specdrill report 'runs/my run'",
    ]


def test_progress_reaches_a_file_line_by_line(tmp_path: Path) -> None:
    """stdout to a file (as `specdrill run ... > log`): the first unit's lines are in the file while the run goes
    on, not only when it ends."""
    campaign = tmp_path / "cut.yaml"
    campaign.write_text(CAMPAIGN)
    log = tmp_path / "log"
    with log.open("w") as sink:
        proc = subprocess.Popen([*SPECDRILL, "simulate", str(campaign), "--output", str(tmp_path / "run"),
                                 "--no-report"], stdout=sink, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            deadline = time.monotonic() + WAIT_S
            while "unit 1/3 arm=off-single shape=steady repeat=0 finished" not in log.read_text():
                assert proc.poll() is None, "the run ended before its first unit's line reached the file"
                assert time.monotonic() < deadline
                time.sleep(0.05)
            running = proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert running
    assert log.read_text().splitlines()[0] == "unit 1/3 arm=off-single shape=steady repeat=0 started"
    assert proc.returncode == 143 and err.startswith("specdrill: stopped by SIGTERM: "), err


def test_the_resume_command_is_the_one_run_quoted_for_a_shell() -> None:
    from orchestrator.execute.progress import resume_command

    options = [("--address", "ray://head:10001"), ("--output", None), ("--serve-port", 8000), ("--no-report", True)]
    assert resume_command("run", "my campaign.yaml", options) == (
        "specdrill run 'my campaign.yaml' --address ray://head:10001 --serve-port 8000 --no-report"
    )


def test_a_signal_in_the_block_is_announced_raised_and_the_old_handler_is_back() -> None:
    import os

    from orchestrator.execute.interrupts import Stopped, stop_on_signals

    before = signal.getsignal(signal.SIGTERM)
    seen: list[Stopped] = []
    with pytest.raises(Stopped) as caught, stop_on_signals(seen.append):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(WAIT_S)  # the handler runs at the next bytecode: this sleep is cut short
    assert caught.value.exit_code == 143 and caught.value.name == "SIGTERM" and seen == [caught.value]
    assert signal.getsignal(signal.SIGTERM) is before


class _SignalsItsOwnFinalizer:
    """The CI case: the signal's handler runs inside a finalizer, where Python swallows what it raises."""

    def __del__(self) -> None:
        import os

        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecodes after the kill, inside the finalizer: the handler runs among them
            pass


def test_a_signal_swallowed_in_a_finalizer_still_stops_the_block_before_the_unit_is_marked() -> None:
    import gc

    from orchestrator.execute.interrupts import Stopped, raise_pending, stop_on_signals

    unraisable_before = sys.unraisablehook
    seen: list[Stopped] = []
    marked = []
    with pytest.raises(Stopped) as caught, stop_on_signals(seen.append):
        doomed = _SignalsItsOwnFinalizer()
        del doomed
        gc.collect()
        survived = True  # the finalizer's stop did not leave it: the block goes on to the unit's end
        raise_pending()  # where a runner writes the unit's marker
        marked.append("unit")
    assert survived and not marked
    assert caught.value.exit_code == 143 and seen == [caught.value]  # announced once
    assert sys.unraisablehook is unraisable_before
    raise_pending()  # the block is over: nothing pending outside it


def test_a_stop_swallowed_after_the_last_check_is_raised_at_the_block_end() -> None:
    from orchestrator.execute.interrupts import Stopped, stop_on_signals

    with pytest.raises(Stopped), stop_on_signals():
        doomed = _SignalsItsOwnFinalizer()
        del doomed


# Issue 33: SIGINT at seeded random moments of a small `simulate` and its closing report (the report's DuckDB
# queries turned a Ctrl-C into "RuntimeError: Query interrupted", a traceback and exit 1, once in ~9 tries).
TINY = two_shapes("tiny")
DELAYS_S = [round(random.Random(f"33:{i}").uniform(0.0, 2.5), 3) for i in range(4)]


def test_the_duckdb_query_interrupted_error_is_the_stop_it_was() -> None:
    """DuckDB turns the signal's stop into its own RuntimeError ("Query interrupted"): the block raises the stop.
    Queries of ~0.1 s each, as a report runs them (DuckDB checks for a signal between pipelines), with SIGINT
    sent once while they run; none is sent after the block, where pytest's own handler is back."""
    import os
    import threading

    import duckdb

    from orchestrator.execute.interrupts import Stopped, stop_on_signals

    con = duckdb.connect()
    inside = threading.Event()
    guard = threading.Lock()

    def interrupt() -> None:
        inside.wait()
        time.sleep(0.3)
        with guard:
            if inside.is_set():
                os.kill(os.getpid(), signal.SIGINT)

    killer = threading.Thread(target=interrupt)
    killer.start()
    deadline = time.monotonic() + WAIT_S
    try:
        with pytest.raises(Stopped) as caught, stop_on_signals():
            try:
                inside.set()
                while time.monotonic() < deadline:
                    con.execute("SELECT sum(hash(range)) FROM range(30000000)").fetchall()
            finally:
                with guard:
                    inside.clear()
    finally:
        inside.clear()
        killer.join()
    assert caught.value.exit_code == 130


def _sigint_after(proc: subprocess.Popen[str], delay_s: float) -> tuple[str, str]:
    """SIGINT `delay_s` from now, then the process's stdout and stderr once it ends (killed if it outlives WAIT_S)."""
    try:
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow  # four small simulate + report processes, ~4 s each here
@pytest.mark.parametrize("delay_s", DELAYS_S)
def test_sigint_at_a_random_moment_of_simulate_and_its_report_is_never_a_traceback(
    delay_s: float, tmp_path: Path
) -> None:
    campaign = tmp_path / "tiny.yaml"
    campaign.write_text(TINY)
    run = tmp_path / "run"
    proc = subprocess.Popen([*SPECDRILL, "simulate", str(campaign), "--output", str(run)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    _read_until(proc, "started")  # past Python's own start-up: from here on the command handles the signal
    _, err = _sigint_after(proc, delay_s)
    assert "Traceback" not in err and "Error" not in err, err
    assert proc.returncode in (0, 130), (proc.returncode, err)  # 0: the signal came after the report finished
    if proc.returncode == 130:
        assert err.startswith(("specdrill: stopped by SIGINT: ", "specdrill: interrupted (SIGINT)")), err
    assert not list(run.rglob(".tmp-*")) and not (run / "writer.lock").exists()  # nothing half-written, no lock


@pytest.mark.parametrize("delay_s", [0.2, 0.6])
def test_sigint_while_the_console_script_imports_the_cli_is_one_line(delay_s: float, tmp_path: Path) -> None:
    # The venv's `specdrill` runs orchestrator.entry:main; importing the CLI takes seconds (Ray, DuckDB, pyarrow)
    # before the CLI's own handlers exist: a Ctrl-C then was a KeyboardInterrupt traceback.
    script = [sys.executable, "-c", "from orchestrator.entry import main; main()"]
    proc = subprocess.Popen([*script, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = _sigint_after(proc, delay_s)
    assert "Traceback" not in err, err
    if proc.returncode == 0:  # the import and --help finished first (a fast host): nothing to interrupt
        assert "Usage: specdrill" in out
    else:
        assert (proc.returncode, err) == (130, "specdrill: interrupted (SIGINT)\n")
