"""Every file a command reads or writes that is missing, truncated, corrupt or of the wrong kind: one line that
names the file and the problem, exit 2, no traceback (issue 25). One small virtual-time run, damaged a copy at a
time; the commands run in-process through the CLI's main."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.tiny_campaigns import as_yaml, sim_campaign

CAMPAIGN = as_yaml(sim_campaign(
    "small", shapes={"ramp": {"kind": "ramp", "rate_from": 1, "rate_to": 8, "duration_s": 6}}, load={"drain_s": 5}
))  # fmt: skip


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as caught:
        main(list(args))
        raise SystemExit(0)
    return int(caught.value.code or 0), capsys.readouterr().err


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from orchestrator.plan.campaign import load_campaign
    from orchestrator.virtual.campaign import simulate_campaign

    root = tmp_path_factory.mktemp("bad")
    (root / "small.yaml").write_text(CAMPAIGN)
    simulate_campaign(load_campaign(root / "small.yaml"), output=str(root / "run"))
    return root / "run"


def _part(run: Path, arm: str) -> Path:
    return next((run / "traces" / f"arm={arm}" / "shape=ramp").glob("part-*.parquet"))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _random(path: Path) -> None:
    path.write_bytes(bytes((i * 37 + 11) % 256 for i in range(3000)))


def _to_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


DAMAGE: dict[str, tuple[Callable[[Path], None], str, str]] = {
    # name: (damage to a copy of the run, file named, words of the problem)
    "manifest truncated": (lambda r: _truncate(r / "manifest.json"), "manifest.json", "not valid JSON"),
    "manifest a directory": (lambda r: _to_directory(r / "manifest.json"), "manifest.json", "is a directory"),
    "manifest not an object": (lambda r: (r / "manifest.json").write_text("[1]"), "manifest.json", "JSON object"),
    "manifest deleted": (lambda r: (r / "manifest.json").unlink(), "run", "no manifest.json"),
    "marker truncated": (lambda r: _truncate(r / "units/dyn-single/ramp/r0.json"), "r0.json", "not valid JSON"),
    "marker foreign": (lambda r: (r / "units/dyn-single/ramp/r0.json").write_text("{}"), "r0.json",
                       "not a unit marker"),
    "first trace part truncated": (lambda r: _truncate(_part(r, "dyn-single")), "part-dyn-single",
                                   "not a readable Parquet"),
    "second trace part random bytes": (lambda r: _random(_part(r, "off-single")), "part-off-single",
                                       "not a readable Parquet"),
    "trace part deleted": (lambda r: _part(r, "off-single").unlink(), "part-off-single",
                           "missing (a trace file of unit"),
    "timeline truncated": (lambda r: _truncate(r / "timelines/arm=dyn-single/shape=ramp/r0.parquet"), "r0.parquet",
                           "not a readable Parquet file (a step timeline)"),
    "timeline deleted": (lambda r: (r / "timelines/arm=dyn-single/shape=ramp/r0.parquet").unlink(), "r0.parquet",
                         "missing (unit dyn-single/ramp/r0's step timeline"),
    "report.html a directory": (lambda r: (r / "report.html").mkdir(exist_ok=True), "report.html", "is a directory"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_run_is_one_line_naming_the_file(
    case: str, pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    (run / "report.html").unlink(missing_ok=True)
    damage, named, words = DAMAGE[case]
    damage(run)
    code, err = cli(capsys, "report", str(run))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("specdrill: error: ") and named in lines[0] and words in lines[0], lines[0]
    # A failed report leaves no summary.json that looks current, so recommend meets the same error, not exit 0.
    assert not (run / "summary.json").exists()
    if case != "report.html a directory":
        code, err = cli(capsys, "recommend", str(run))
        assert code == 2 and err.strip().splitlines() == lines, err


def test_report_given_a_file_or_nothing(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = cli(capsys, "report", str(pristine / "manifest.json"))
    assert code == 2 and err.strip() == (
        f"specdrill: error: {pristine / 'manifest.json'}: is a file, expected a directory (a run directory)"
    )
    code, err = cli(capsys, "report", str(pristine / "nothing"))
    assert code == 2 and err.strip().endswith("nothing: no such directory (a run directory)")
    assert not (pristine / "nothing").exists()  # reading a run never creates one


def test_a_damaged_summary_is_rebuilt_by_recommend(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    (run / "summary.json").write_text('{"campaign": ')
    code, err = cli(capsys, "recommend", str(run))
    # Rebuilt from the traces: this 6-second ramp is too short for any verdict, and recommend says so (exit 4)
    assert code == 4 and err == ""


def test_a_summary_older_than_its_traces_is_refused(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    cli(capsys, "report", str(run))
    summary = json.loads((run / "summary.json").read_text())
    summary["units"] = summary["units"][:-1]  # the report ran before the last unit was complete
    (run / "summary.json").write_text(json.dumps(summary))
    code, err = cli(capsys, "recommend", str(run))
    assert code == 2 and err.strip() == (
        f"specdrill: error: {run / 'summary.json'}: older than the run's traces (1 of 2 complete units not in it): "
        f"run `specdrill report {run}` first"
    )


@pytest.mark.parametrize(
    ("output", "words"),
    [("plainfile/run", "plainfile/run: cannot create the run directory: Not a directory"),
     ("/proc/specdrill-run", "/proc/specdrill-run: cannot create the run directory: /proc takes no new directory")],
)  # fmt: skip
def test_an_output_that_cannot_be_a_directory(
    output: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "small.yaml").write_text(CAMPAIGN)
    (tmp_path / "plainfile").write_text("")
    target = output if output.startswith("/") else str(tmp_path / output)
    code, err = cli(capsys, "simulate", str(tmp_path / "small.yaml"), "--output", target)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_campaign_and_profile_files_of_the_wrong_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xc7\x00\xff" * 50)
    code, err = cli(capsys, "simulate", str(binary))
    assert code == 2 and f"campaign file {binary}: not UTF-8 text" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "profiles").mkdir()
    mine = tmp_path / "mine.yaml"
    mine.write_text(CAMPAIGN.replace("llama3.1-8b-h100-eagle", str(tmp_path / "profiles")))
    code, err = cli(capsys, "simulate", str(mine))
    assert code == 2 and f"profile file {tmp_path / 'profiles'} is a directory, expected a YAML file" in err
