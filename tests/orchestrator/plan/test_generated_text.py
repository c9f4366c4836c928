"""A real engine sent specdrill's template text is warned about, at the run's start and in the report (console,
report.html, summary.json); a simulated engine, and a mix of data sets, are not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.plan.campaign import Campaign
from orchestrator.plan.generated_text import GENERATED_MARK
from tests.loadshapes.datasets import files

ENDPOINT = {
    "kind": "endpoint",
    "model": "m",
    "urls": {"off-single": "http://127.0.0.1:1", "fixed3-single": "http://127.0.0.1:2"},
}
VLLM = {"kind": "vllm", "model": "facebook/opt-125m"}
SIMULATED = {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"}
TEMPLATE = {"entries": [{"workload": "chat", "weight": 2}, {"workload": "reasoning", "weight": 1}]}


def _campaign(engine: dict[str, Any], mix: dict[str, Any], shapes: dict[str, Any] | None = None) -> Campaign:
    return Campaign.model_validate({
        "name": "t", "engine": engine, "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": shapes or {"s": {"kind": "sustained", "rate": 2, "duration_s": 5}}, "mix": mix,
    })  # fmt: skip


@pytest.mark.parametrize("engine", [VLLM, ENDPOINT], ids=["vllm", "endpoint"])
def test_template_text_to_a_real_engine_is_one_line_naming_the_workloads(engine: dict[str, Any]) -> None:
    (line,) = _campaign(engine, TEMPLATE).generated_text_lines()
    assert line.startswith(GENERATED_MARK) and "the mix's workloads (chat, reasoning)" in line
    assert "measure the template" in line and "mix: {dataset: ...}" in line


def test_a_simulated_engine_and_a_data_set_are_silent(tmp_path: Path) -> None:
    assert _campaign(SIMULATED, TEMPLATE).generated_text_lines() == []
    sharegpt = files.sharegpt(tmp_path / "sg.json")
    assert _campaign(ENDPOINT, {"dataset": str(sharegpt)}).generated_text_lines() == []


def test_a_replay_on_a_real_engine_is_template_text_whatever_the_mix(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("0.0\n0.5\n1.0\n1.5\n")
    sharegpt = files.sharegpt(tmp_path / "sg.json")
    campaign = _campaign(ENDPOINT, {"dataset": str(sharegpt)}, {"day": {"kind": "replay", "path": str(trace)}})
    (line,) = campaign.generated_text_lines()
    assert "the replayed shapes (day: a trace records lengths, not text)" in line


def test_the_report_says_it_in_the_console_the_page_and_summary_json(tmp_path: Path) -> None:
    """A run's report whose campaign names an endpoint: the line is in summary.json's headline, report.html and
    the console. (The run itself is simulated; its manifest then says what a run against an endpoint records when
    it starts, which is all the report reads of it: the line is not derived again from the campaign.)"""
    campaign = tmp_path / "c.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "gt", "engine": SIMULATED, "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": {"s": {"kind": "sustained", "rate": 4, "duration_s": 5}}, "mix": TEMPLATE,
        "output": str(tmp_path / "run"),
    }))  # fmt: skip
    done = CliRunner().invoke(cli, ["simulate", str(campaign)])
    assert done.exit_code in (0, 1), done.output
    assert GENERATED_MARK not in done.output  # a simulated engine: silent
    manifest_file = tmp_path / "run" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    assert manifest["generated_text"] == []
    manifest["campaign"]["engine"] = ENDPOINT
    manifest["generated_text"] = _campaign(ENDPOINT, TEMPLATE).run_notes()["generated_text"]
    manifest_file.write_text(json.dumps(manifest))
    done = CliRunner().invoke(cli, ["report", str(tmp_path / "run")])
    assert done.exit_code in (0, 1), done.output
    said = [line for line in done.output.splitlines() if line.startswith(GENERATED_MARK)]
    assert len(said) == 1 and "the mix's workloads (chat, reasoning)" in said[0]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [h for h in summary["headline"] if h.startswith(GENERATED_MARK)] == said
    assert GENERATED_MARK in (tmp_path / "run" / "report.html").read_text()


def test_run_says_it_before_the_first_unit(tmp_path: Path) -> None:
    """`specdrill run` on an endpoint campaign: the line among the run's first (stdout), then the run (refused
    here: nothing listens at the URLs)."""
    campaign = tmp_path / "c.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "gt", "engine": ENDPOINT, "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": {"s": {"kind": "sustained", "rate": 4, "duration_s": 5}}, "mix": TEMPLATE,
        "output": str(tmp_path / "run"),
    }))  # fmt: skip
    done = CliRunner().invoke(cli, ["run", str(campaign), "--address", "127.0.0.1:9"])
    said = [line for line in done.stdout.splitlines() if GENERATED_MARK in line]
    assert said == _campaign(ENDPOINT, TEMPLATE).generated_text_lines(), done.output  # on stdout: not an error
    assert GENERATED_MARK not in done.stderr


def test_a_run_records_the_line_when_it_starts(tmp_path: Path) -> None:
    """The manifest a run against an endpoint opens holds the line (what summary.json and the report say)."""
    from orchestrator.rundir.layout import RunStore
    from orchestrator.rundir.manifest import open_run

    campaign = _campaign(ENDPOINT, TEMPLATE).model_copy(update={"output": str(tmp_path / "run")})
    manifest = open_run(campaign, RunStore(campaign.output_dir()))
    assert manifest["generated_text"] == campaign.generated_text_lines() and len(manifest["generated_text"]) == 1
