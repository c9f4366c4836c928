"""A run on a data set (or a replayed trace) is read from its directory alone: after the file moved (or the run
directory was copied to a machine without it), report and recommend still answer, since what the run sent is in
its trace. A new campaign still reads its data set at once, so resuming a run whose data set is gone is one line,
nothing written; pointed at the moved file (the same content) the run resumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from tests.loadshapes.datasets.files import spec_bench
from tests.loadshapes.replay_formats.test_replay_formats import azure
from tests.tiny_campaigns import as_yaml, sim_campaign


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main(list(args))
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(caught.value.code or 0), out, err


@pytest.fixture
def moved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A finished two-arm simulated run on a Spec-Bench file, the file then moved to another directory."""
    spec_bench(tmp_path / "question.jsonl")
    campaign = sim_campaign(
        "moved", policies={"off": "off", "k1": "fixed:1"}, mix={"dataset": "question.jsonl"},
        shapes={"s": {"kind": "quiet", "rate": 4, "duration_s": 10}}, load={"drain_s": 30},
    )  # fmt: skip
    (tmp_path / "c.yaml").write_text(as_yaml(campaign))
    code, _, err = _cli(capsys, "simulate", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "run"), "--no-report")
    assert code == 0, err
    (tmp_path / "elsewhere").mkdir()
    shutil.move(tmp_path / "question.jsonl", tmp_path / "elsewhere" / "question.jsonl")
    return tmp_path


def test_report_and_recommend_read_a_run_whose_data_set_moved(moved: Path, capsys) -> None:
    code, out, err = _cli(capsys, "report", str(moved / "run"))
    assert code == 0, err
    summary = json.loads((moved / "run" / "summary.json").read_text())
    categories = {r["category"] for r in summary["acceptance_by_category"]}
    assert categories == {"coding", "writing", "math_reasoning", "stem"}, categories
    assert "acceptance by category" in out
    code, out, err = _cli(capsys, "recommend", str(moved / "run"))
    assert code == 0, err
    assert "recommended-campaign.yaml" in out
    # the generated campaign names the file the run read: running it reads it then (one line where it is gone)
    rehearsal = yaml.safe_load((moved / "run" / "recommended-campaign.yaml").read_text())
    assert rehearsal["mix"]["dataset"] == str(moved / "question.jsonl")
    # ... and recommend says so, once per campaign it wrote; with the file back, it says nothing
    said = f"recommended-campaign.yaml names {moved / 'question.jsonl'}, which is not here: point it at the file"
    assert out.count(said) == 1, out
    shutil.move(moved / "elsewhere" / "question.jsonl", moved / "question.jsonl")
    code, out, err = _cli(capsys, "recommend", str(moved / "run"))
    assert code == 0, err
    assert "which is not here" not in out


def test_a_copied_run_directory_reads_without_its_data_set(moved: Path, capsys) -> None:
    shutil.copytree(moved / "run", moved / "copy")
    shutil.rmtree(moved / "elsewhere")  # the other machine has no such file anywhere
    code, out, err = _cli(capsys, "report", str(moved / "copy"))
    assert code == 0, err
    assert "k1-single" in out


def test_resuming_without_the_data_set_is_one_line_and_with_it_moved_resumes(moved: Path, capsys) -> None:
    run = moved / "run"
    marker = run / "units" / "k1-single" / "s" / "r0.json"
    marker.unlink()  # an interrupted run: the k1 unit not marked complete
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    code, out, err = _cli(capsys, "simulate", str(moved / "c.yaml"), "--output", str(run), "--no-report")
    assert code == 2 and out == "", (code, out)
    (line,) = err.strip().splitlines()
    assert "question.jsonl" in line and "no such data set file" in line, line
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written
    # The campaign pointed at the moved file: the same content, the same campaign; the missing unit is run again.
    campaign = yaml.safe_load((moved / "c.yaml").read_text())
    campaign["mix"]["dataset"] = "elsewhere/question.jsonl"
    (moved / "c.yaml").write_text(as_yaml(campaign))
    code, out, err = _cli(capsys, "simulate", str(moved / "c.yaml"), "--output", str(run), "--no-report")
    assert code == 0, err
    assert marker.exists()
    said = out + err
    assert "resuming in" in said and "1 of 2 units already complete, 1 to run" in said, said


def test_a_replay_run_reads_after_its_trace_moved(tmp_path: Path, capsys) -> None:
    """The same for a replay shape's trace file: report and recommend read the run; recommend's follow-up takes
    the replay's length from the run's units, as it cannot be read from the trace now."""
    rows = [(f"2023-11-16 18:15:{i // 4:02d}.{(i % 4) * 25:02d}0000", 100 + i, 20 + i % 7) for i in range(40)]
    azure(tmp_path / "trace.csv", rows)
    campaign = sim_campaign("replayed", policies={"off": "off", "k1": "fixed:1"},
                            shapes={"r": {"kind": "replay", "path": "trace.csv"}}, load={"drain_s": 30})  # fmt: skip
    (tmp_path / "c.yaml").write_text(as_yaml(campaign))
    code, _, err = _cli(capsys, "simulate", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "run"), "--no-report")
    assert code == 0, err
    shutil.move(tmp_path / "trace.csv", tmp_path / "moved.csv")
    code, out, err = _cli(capsys, "report", str(tmp_path / "run"))
    assert code == 0 and "k1-single" in out, err
    code, out, err = _cli(capsys, "recommend", str(tmp_path / "run"))
    assert code == 0 and "recommended-campaign.yaml" in out, err
