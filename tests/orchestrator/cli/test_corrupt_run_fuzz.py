"""Corrupted run directories (issue 25): every kind of file a finished run holds (manifest.json with its campaign
copy, summary.json, unit markers, trace Parquet, timeline Parquet) truncated, bit-flipped or deleted at seeded
random places, then `report` and `recommend` through the CLI's main. Each ends in one line naming a file of the
run and the problem, exit 2, never a traceback; or, only where the damage left every file readable as its kind
(a flipped bit inside a value: no checksum guards these files) or hit an output the command rewrites
(summary.json), in the command's ordinary outcome. Unwritable outputs (under a regular file, in /proc): one line,
exit 2, before any work. One finished virtual-time run, copied per case."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from tests.tiny_campaigns import cli_exit, two_shapes

SEED = 25
DRAWS = int(os.environ.get("SPECDRILL_FUZZ_EXAMPLES", "2"))  # per (file kind, damage); CI runs this many
EXIT_BAD_FILE = 2
ORDINARY = (0, 3)  # a report's exit codes: all gates pass, a gate failed

CAMPAIGN = two_shapes("fuzzed")

KINDS: dict[str, Callable[[Path, random.Random], Path]] = {
    "manifest": lambda run, rng: run / "manifest.json",
    "summary": lambda run, rng: run / "summary.json",
    "marker": lambda run, rng: rng.choice(sorted((run / "units").rglob("*.json"))),
    "trace": lambda run, rng: rng.choice(sorted((run / "traces").rglob("*.parquet"))),
    "timeline": lambda run, rng: rng.choice(sorted((run / "timelines").rglob("*.parquet"))),
}


def truncate(path: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(len(data))])  # strictly shorter: a JSON object loses its closing brace


def flip(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def delete(path: Path, rng: random.Random) -> None:
    path.unlink()


DAMAGES: dict[str, Callable[[Path, random.Random], None]] = {"truncate": truncate, "flip": flip, "delete": delete}
CASES = [(kind, damage, draw) for kind in KINDS for damage in DAMAGES for draw in range(DRAWS)]


cli = cli_exit


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with its report written (summary.json and report.html beside the traces)."""
    import io

    from rich.console import Console

    from orchestrator.plan.campaign import load_campaign
    from orchestrator.report.build import write_report
    from orchestrator.virtual.campaign import simulate_campaign

    root = tmp_path_factory.mktemp("fuzzed")
    (root / "fuzzed.yaml").write_text(CAMPAIGN)
    store, _ = simulate_campaign(load_campaign(root / "fuzzed.yaml"), output=str(root / "run"))
    write_report(store.root, console=Console(file=io.StringIO(), width=200))
    return root / "run"


def readable(path: Path) -> bool:
    """The file still reads as its kind: JSON that parses, Parquet whose every row decodes."""
    if not path.exists():
        return False
    try:
        if path.suffix == ".json":
            json.loads(path.read_bytes().decode())
        else:
            pq.read_table(path)
    except Exception:  # any reader failure at all means unreadable: that is what is being decided
        return False
    return True


def _summary(run: Path) -> object:
    """summary.json but the time it was generated and its seal (which covers that time)."""
    path = run / "summary.json"
    data = json.loads(path.read_text()) if path.exists() else None
    return {k: v for k, v in data.items() if k not in ("generated", "evidence")} if data is not None else None


def _close(a: object, b: object) -> bool:
    """Equal, floats to 1e-9 relative: DuckDB sums in parallel, in no fixed order (the last digit varies)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


# ~1-2 s a case, 30 cases: the suite runs them, `make test-fast` has tests/orchestrator/cli/test_bad_files.py
@pytest.mark.slow
@pytest.mark.parametrize(("kind", "damage", "draw"), CASES, ids=[f"{k}-{d}-{i}" for k, d, i in CASES])
def test_a_corrupted_run_is_one_line_naming_a_file_and_exit_2(
    kind: str, damage: str, draw: int, finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(f"{SEED}:{kind}:{damage}:{draw}")
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    target = KINDS[kind](run, rng)
    DAMAGES[damage](target, rng)
    still_readable = readable(target)
    for command in ("report", "recommend"):
        code, err = cli(capsys, command, str(run))
        lines = err.strip().splitlines()
        assert "Traceback" not in err and code != 1, f"{command} after {damage} of {target}: {err}"
        if code == EXIT_BAD_FILE:
            assert len(lines) == 1 and lines[0].startswith("specdrill: error: "), err
            # the file is named: the damaged one, or (a flipped name in the manifest) the file it no longer matches
            named = lines[0].removeprefix("specdrill: error: ")
            assert named.startswith(str(run)), lines[0]
            if damage != "flip":
                assert str(target) in lines[0] or (kind == "manifest" and "no manifest.json" in lines[0]), lines[0]
            continue
        # An ordinary outcome only where nothing it reads is damaged: summary.json (report rewrites it, recommend
        # rebuilds a damaged one from the traces), a flip that left the file readable (no checksum to catch it),
        # or a flip in data the report does not read (its summary is the undamaged run's).
        assert code in ORDINARY, (command, code, err)
        same = _close(_summary(run), _summary(finished))
        assert kind == "summary" or (damage == "flip" and (still_readable or same)), (command, kind, code, err)
        assert command == "recommend" or err == "", err
    if damage in ("truncate", "delete") and kind != "summary":
        assert code == EXIT_BAD_FILE  # what is missing or cut short is always caught


def test_the_fuzz_covers_every_kind_of_file_the_run_holds(finished: Path) -> None:
    files = {p.relative_to(finished).parts[0] for p in finished.rglob("*") if p.is_file()}
    assert files == {"manifest.json", "summary.json", "report.html", "units", "traces", "timelines"}
    # report.html is the report's output only (nothing reads it back): tests/orchestrator/cli/test_bad_files.py makes
    # it unwritable


@pytest.mark.parametrize("where", ["under a regular file", "in /proc"])
@pytest.mark.parametrize("command", ["simulate", "tune", "calibrate"])
def test_an_unwritable_output_is_one_line_before_any_work(
    command: str, where: str, finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fuzzed.yaml").write_text(CAMPAIGN)
    (tmp_path / "plainfile").write_text("")
    output = str(tmp_path / "plainfile" / "out") if where == "under a regular file" else "/proc/specdrill-out"
    args = {
        "simulate": ["simulate", str(tmp_path / "fuzzed.yaml"), "--output", output],
        "tune": ["tune", str(tmp_path / "fuzzed.yaml"), "--budget", "2", "--seeds", "1", "-o", output],
        "calibrate": ["calibrate", str(finished), "-o", f"{output}/fitted.yaml"],
    }[command]
    code, err = cli(capsys, *args)
    lines = err.strip().splitlines()
    assert code == EXIT_BAD_FILE and len(lines) == 1, err
    problem = "Not a directory" if where == "under a regular file" else "/proc takes no new directory"
    assert lines[0].startswith(f"specdrill: error: {output}") and problem in lines[0], lines[0]
    assert not Path(output).exists()


def random_bytes(path: Path, rng: random.Random) -> None:
    path.write_bytes(bytes(rng.randrange(256) for _ in range(3000)))


REPLAY_DAMAGES = {**DAMAGES, "random bytes": random_bytes}
REPLAY_CASES = [(damage, draw) for damage in REPLAY_DAMAGES for draw in range(DRAWS)]


@pytest.mark.slow  # a campaign run per case
@pytest.mark.parametrize(("damage", "draw"), REPLAY_CASES, ids=[f"{d}-{i}" for d, i in REPLAY_CASES])
def test_a_damaged_replay_file_is_one_line_or_a_run(
    damage: str, draw: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay file a campaign's shape reads (`run` and `simulate` read it; the report does not): damaged, it is
    one line naming it and exit 2, or (cut at a line end, a flipped digit: still arrival times) a run."""
    rng = random.Random(f"{SEED}:replay:{damage}:{draw}")
    arrivals = tmp_path / "arrivals.csv"
    arrivals.write_text("\n".join(f"{0.05 * i:.3f}" for i in range(60)) + "\n")
    (tmp_path / "replayed.yaml").write_text(two_shapes("fuzzed", calm={"kind": "replay", "path": str(arrivals),
                                                                       "bin_s": 0.5}))  # fmt: skip
    REPLAY_DAMAGES[damage](arrivals, rng)
    code, err = cli(capsys, "simulate", str(tmp_path / "replayed.yaml"), "--output", str(tmp_path / "run"),
                    "--no-report")  # fmt: skip
    assert "Traceback" not in err and code in (0, EXIT_BAD_FILE), err
    if code == EXIT_BAD_FILE:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and str(arrivals) in lines[0], err
        assert not (tmp_path / "run").exists()  # refused before anything ran
    assert code == EXIT_BAD_FILE or damage in ("truncate", "flip"), err


@pytest.mark.parametrize("kind", ["trace", "timeline"])
def test_a_column_renamed_in_a_footer_is_named(
    kind: str, finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a flipped bit in a footer's column name does (the fuzz found `schudule_dropped`): DuckDB, reading by
    name, raised a binder error naming no file."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    target = KINDS[kind](run, random.Random(SEED))
    table = pq.read_table(target)
    column, renamed = ("schedule_dropped", "schudule_dropped") if kind == "trace" else ("batch_size", "batch_sire")
    pq.write_table(table.rename_columns([renamed if n == column else n for n in table.column_names]), target)
    for command in ("report", "recommend"):
        code, err = cli(capsys, command, str(run))
        assert code == EXIT_BAD_FILE and err.strip() == (
            f"specdrill: error: {target}: not a readable Parquet file "
            f"({'a trace part file' if kind == 'trace' else 'a step timeline'}): unknown column {renamed!r}"
        ), err


# --- issue 33: one writer per run directory, caches checked against the traces, partial runs, interrupts ---

SPECDRILL = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
WAIT_S = 120  # bound on every wait: a run that hangs fails the test instead of the suite


def _requests_in_traces(run: Path) -> tuple[int, int]:
    """(rows, distinct request ids) over every trace file of the run: a request counted twice shows as more rows."""
    table = pq.ParquetDataset(run / "traces").read(columns=["request_id"])
    ids = table.column("request_id").to_pylist()
    return len(ids), len(set(ids))


def _counted(run: Path) -> dict[str, int]:
    """Requests per arm the report counted, from its summary.json's first map (every band summed)."""
    summary = json.loads((run / "summary.json").read_text())
    counted: dict[str, int] = {}
    for cell in summary["maps"][0]["cells"]:
        counted[cell["arm"]] = counted.get(cell["arm"], 0) + cell["requests"]
    return counted


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert proc.poll() is None, f"the writer ended before its lock was seen: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {path} within {WAIT_S} s"
        time.sleep(0.005)


@pytest.mark.slow  # three `specdrill simulate` processes and a report, ~10 s
def test_two_concurrent_writers_one_wins_and_the_report_counts_each_request_once(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `specdrill simulate` processes into one directory. Held mid-run (SIGSTOP once its lock is there), the
    first makes the second exit 2 in one line naming it; then both started at once, with no hold: one runs, the
    other is refused or (started after the first finished) resumes a complete run. The report counts every
    request once: the rows and per-arm counts of the same campaign run alone (the `finished` run)."""
    (tmp_path / "fuzzed.yaml").write_text(CAMPAIGN)
    args = ["simulate", str(tmp_path / "fuzzed.yaml"), "--no-report", "--output"]
    held = tmp_path / "held"
    first = subprocess.Popen([*SPECDRILL, *args, str(held)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    try:
        _wait_for(held / "writer.lock", first)
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run([*SPECDRILL, *args, str(held)], capture_output=True, text=True, timeout=WAIT_S,
                                check=False)  # fmt: skip
        first.send_signal(signal.SIGCONT)
        _, first_err = first.communicate(timeout=WAIT_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, first_err
    assert second.returncode == EXIT_BAD_FILE and len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert second.stderr.startswith(f"specdrill: error: {held / 'writer.lock'}: another writer holds this run "
                                    f"directory: pid {first.pid} on host "), second.stderr  # fmt: skip

    raced = tmp_path / "raced"
    both = [subprocess.Popen([*SPECDRILL, *args, str(raced)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]  # fmt: skip
    outcomes = [(p.wait(timeout=WAIT_S), p.communicate()[1]) for p in both]
    codes = sorted(code for code, _ in outcomes)
    assert codes in ([0, 0], [0, EXIT_BAD_FILE]), outcomes
    assert all("Traceback" not in err for _, err in outcomes), outcomes

    expected = _requests_in_traces(finished)
    for run in (held, raced):
        assert not (run / "writer.lock").exists()
        assert _requests_in_traces(run) == expected and expected[0] == expected[1]
        code, _, err = _cli_output(capsys, "report", str(run))
        assert code in ORDINARY and err == "", err
        assert _counted(run) == _counted(finished)


def _inflate_marker_rows(run: Path) -> Path:
    """A unit's marker and its manifest entry both claim twice the rows (consistent with each other)."""
    marker = sorted((run / "units").rglob("*.json"))[0]
    data = json.loads(marker.read_text())
    data["rows"] *= 2
    marker.write_text(json.dumps(data))
    manifest = json.loads((run / "manifest.json").read_text())
    key = f"{data['unit']['arm']}/{data['unit']['shape']}/r{data['unit']['repeat']}"
    manifest["units"][key]["rows"] = data["rows"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    return marker


def _inflate_marker_steps(run: Path) -> Path:
    marker = sorted((run / "units").rglob("*.json"))[-1]
    data = json.loads(marker.read_text())
    data["timeline_steps"] += 100
    marker.write_text(json.dumps(data))
    return marker


def _resize_stamp(run: Path) -> Path:
    """The marker's record of a trace file says another size: the file changed after the unit was recorded."""
    marker = sorted((run / "units").rglob("*.json"))[1]
    data = json.loads(marker.read_text())
    name = sorted(data["trace_stamps"])[0]
    data["trace_stamps"][name]["bytes"] += 1
    marker.write_text(json.dumps(data))
    return next(run.glob(f"traces/*/*/{name}"))


def _second_writers_copy(run: Path) -> Path:
    """A copy of a unit's trace file under another part name: what a second writer of the unit leaves."""
    original = sorted((run / "traces").rglob("*.parquet"))[0]
    copy = original.with_name(original.name.replace("-000001-", "-000002-"))
    shutil.copy(original, copy)
    return copy


EDITS: dict[str, Callable[[Path], Path]] = {
    "marker rows inflated": _inflate_marker_rows,
    "marker steps inflated": _inflate_marker_steps,
    "trace file resized": _resize_stamp,
    "second writer's trace file": _second_writers_copy,
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_marker_that_disagrees_with_the_traces_is_refused(
    edit: str, finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    named = EDITS[edit](run)
    for command in ("report", "recommend"):
        code, err = cli(capsys, command, str(run))
        assert code == EXIT_BAD_FILE and len(err.strip().splitlines()) == 1, (command, err)
        assert err.startswith(f"specdrill: error: {named}: "), err


def test_a_hand_edited_summary_is_rebuilt_from_the_traces(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """summary.json's counts changed by hand (a band's n set to 1004): recommend says it does not use it and
    decides from the traces, exactly as on the unedited run."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    summary = json.loads((run / "summary.json").read_text())
    for cell in summary["maps"][0]["cells"]:
        cell["requests"] = 1004
    (run / "summary.json").write_text(json.dumps(summary))
    reference = tmp_path / "reference"
    shutil.copytree(finished, reference)
    code_ref, out_ref, err_ref = _cli_output(capsys, "recommend", str(reference))
    code, out, err = _cli_output(capsys, "recommend", str(run))
    assert code == code_ref and err_ref == "", err_ref
    assert err == (f"specdrill: {run / 'summary.json'}: not used, its content was changed after the report "
                       "wrote it: rebuilt from the traces\n")  # fmt: skip
    assert out.replace(str(run), "RUN") == out_ref.replace(str(reference), "RUN")
    assert "n=1004" not in out


def _cli_output(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of a command through the CLI's main."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as caught:
        main(list(args))
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return (caught.value.code if isinstance(caught.value.code, int) else 1), out, err


def _simulate_order(campaign: dict[str, Any], arms: list[str]) -> list[str]:
    """The order `simulate` completes units in: shape by shape, repeat by repeat, every arm in turn."""
    return [f"{a}/{s}/r0" for s in campaign["shapes"] for a in arms]


def _run_order(campaign: dict[str, Any], arms: list[str]) -> list[str]:
    """The order `run` completes units in: arm by arm, each arm's shapes and repeats."""
    return [f"{a}/{s}/r0" for a in arms for s in campaign["shapes"]]


def _keep_units(run: Path, keep: list[str]) -> None:
    """The run as it was when only `keep` had completed: the other units' markers, traces and timelines gone,
    the manifest without them and unfinished, no report."""
    from urllib.parse import quote

    manifest = json.loads((run / "manifest.json").read_text())
    for key in list(manifest["units"]):
        if key in keep:
            continue
        arm, shape, repeat = key.split("/")
        (run / "units" / arm / shape / f"{repeat}.json").unlink()
        partition = f"arm={quote(arm, safe='')}/shape={quote(shape, safe='')}"
        for part in (run / "traces" / partition).glob(f"part-{arm}-{shape}-{repeat}-w*"):
            part.unlink()
        (run / "timelines" / partition / f"{repeat}.parquet").unlink()
        del manifest["units"][key]
    manifest.pop("finished_ns", None)
    (run / "manifest.json").write_text(json.dumps(manifest))
    for name in ("summary.json", "report.html"):
        (run / name).unlink()


# (the runner's order of units, arms in the campaign's order or reversed: `off` last), units kept
# (run's first unit is simulate's: not repeated)
PREFIX_CASES = [*[("simulate", k) for k in range(4)], ("run", 2), ("run", 3), *[("run-off-last", k) for k in (1, 2, 3)]]


@pytest.mark.slow  # three commands per prefix, ~3 s a case
@pytest.mark.parametrize(("order", "kept"), PREFIX_CASES, ids=[f"{o}-{k}" for o, k in PREFIX_CASES])
def test_every_reading_command_on_a_run_stopped_at_a_unit_boundary(
    order: str, kept: int, finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished run cut back to each prefix of its units, in the order `simulate` and `run` complete them:
    report, recommend and calibrate each work (saying the run is partial) or say what is missing in one line."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    manifest = json.loads((run / "manifest.json").read_text())
    arms = ["off-single", "dyn-single"] if order != "run-off-last" else ["dyn-single", "off-single"]
    units = (_simulate_order if order == "simulate" else _run_order)(manifest["campaign"], arms)
    _keep_units(run, units[:kept])
    baseline_done = any(u.startswith("off-single/") for u in units[:kept])
    for command in ("report", "recommend", "calibrate"):
        extra = ["-o", str(tmp_path / "fitted.yaml")] if command == "calibrate" else []
        code, out, err = _cli_output(capsys, command, str(run), *extra)
        assert "Traceback" not in err and code != 1, (command, err)
        lines = err.strip().splitlines()
        assert baseline_done or command == "calibrate" or code == EXIT_BAD_FILE, (command, code, out)
        if code == EXIT_BAD_FILE:
            assert len(lines) == 1 and lines[0].startswith("specdrill: error: "), (command, err)
            if command != "calibrate":  # calibrate's one line says what its fit lacks
                assert baseline_done is False and "nothing to analyse yet" in lines[0], lines[0]
                assert f"resume with specdrill simulate CAMPAIGN --output {run}" in lines[0], lines[0]
            continue
        assert code in (0, 3, 4), (command, code, err)  # 4: recommend's insufficient data
        if command == "report":
            assert out.startswith(f"partial run: {kept} of 4 units complete (not run: "), out
