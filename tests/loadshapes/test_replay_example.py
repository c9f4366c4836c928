"""The worked example: a bursty BurstGPT-format window replayed onto the quickstart arms in virtual time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from loadshapes.shapes import Replay
from loadshapes.trace import read_traces
from orchestrator.cli import cli
from orchestrator.plan.campaign import load_campaign
from orchestrator.virtual.campaign import simulate_campaign
from tests import REPO as ROOT

EXAMPLE = "campaigns/replay-burstgpt-example.yaml"


def test_the_checked_in_sample_is_what_the_seeded_script_writes(tmp_path: Path) -> None:
    out = tmp_path / "sample.csv"
    script = ROOT / "examples" / "make_burstgpt_sample.py"
    subprocess.run([sys.executable, str(script), "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes() == (ROOT / "examples" / "burstgpt-sample.csv").read_bytes()


def test_the_example_replays_its_bursts_with_recorded_lengths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # EXAMPLE is named from the repository root (the campaign names its sample from its own)
    campaign = load_campaign(EXAMPLE)
    shape = campaign.shapes["bursty"]
    assert isinstance(shape, Replay) and shape.has_lengths
    rates = np.array([p.rate_start for p in shape.phases()])
    assert np.median(rates) < 5 and rates.max() > 15  # quiet near 3 req/s, bursts above 15

    result = CliRunner().invoke(cli, ["simulate", EXAMPLE, "--output", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output  # `specdrill simulate`: the run, then its report
    assert "operating map by offered rate" in result.output
    table = read_traces(str(tmp_path / "run" / "traces"), columns=["arm", "request_index", "offered_rate_rps",
                                                                   "prompt_tokens", "category", "status"])  # fmt: skip
    off = table.filter(pc.equal(table["arm"], "off-single")).sort_by("request_index")
    assert off.num_rows == shape.expected_requests
    offered = np.asarray(off["offered_rate_rps"].to_numpy())
    assert (offered < 5).sum() > 100 and (offered > 15).sum() > 300  # the bursts are in the offered rates
    recorded = shape.requests(np.asarray(off["request_index"].to_numpy()))
    np.testing.assert_array_equal(np.asarray(off["prompt_tokens"].to_numpy()), recorded.prompt_tokens)
    assert set(off["category"].to_pylist()) == {"chat", "editing"}  # GPT-4 rows are editing, the rest chat
    for arm in ("dyn-single", "fixed3-single", "dyn-dp2"):  # every arm got the same requests
        other = table.filter(pc.equal(table["arm"], arm)).sort_by("request_index")
        assert other["request_index"].equals(off["request_index"])

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    by_rate = next(m for m in summary["maps"] if m["measure"] == "offered_rate")
    assert max(band["low"] for band in by_rate["bands"]) > 15  # the report's offered-rate map reaches the bursts


def test_failed_requests_kept_get_the_error_they_expect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    campaign = load_campaign(EXAMPLE)
    bursty = campaign.shapes["bursty"]
    assert isinstance(bursty, Replay)
    shape = bursty.model_copy(update={"failed": "expect_error", "duration_s": 20.0})
    campaign = campaign.model_copy(update={"shapes": {"bursty": Replay.model_validate(shape.model_dump())}})
    simulate_campaign(campaign, output=str(tmp_path / "run"))
    table = read_traces(str(tmp_path / "run" / "traces"), columns=["arm", "category", "status", "error_message"])
    off = table.filter(pc.equal(table["arm"], "off-single"))
    failed = off.filter(pc.equal(off["category"], "failed"))
    assert failed.num_rows > 0 and set(failed["status"].to_pylist()) == {"error"}
    messages = set(failed["error_message"].to_pylist())
    assert messages == {"error event in stream: max_tokens: Input should be greater than or equal to 1"}
    rest = off.filter(pc.not_equal(off["category"], "failed"))
    assert set(rest["status"].to_pylist()) == {"ok"}
