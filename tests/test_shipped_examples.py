"""Every campaign specdrill ships (campaigns/, examples/) is a campaign `specdrill simulate` and `run` accept, from
any working directory, and the campaign reference lists exactly those files.

Issue 40: examples/sim-campaign.yaml, listed as a shipped example, was refused by `specdrill simulate` ("shapes: a
campaign needs at least one shape to run"). The only test that read it (tests/infra/test_infra.py, `models pull`)
loads a campaign without asking for traffic, as `deploy` does; nothing checked what `simulate` and `run` check."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.plan.campaign import load_campaign
from tests import REPO
from tests.hub_cache import SHAREGPT, offline_sharegpt
from tests.tiny_model import build_tiny_tokenizer
from tools import docgen

SHIPPED = sorted(
    str(path.relative_to(REPO)) for folder in ("campaigns", "examples") for path in (REPO / folder).glob("*.yaml")
)


def test_the_campaign_reference_lists_every_shipped_campaign() -> None:
    text = docgen.campaign_reference()
    sentence = text[text.index("Shipped examples:") : text.index("Sections:")]
    assert sorted(re.findall(r"`([^`]+\.yaml)`", sentence)) == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_campaign_has_what_simulate_and_run_need(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # not the repository: the files a campaign names are read relative to it
    offline_sharegpt(monkeypatch, tmp_path)  # the GPU campaign's data set, as the Hub cache holds it once fetched
    campaign = load_campaign(REPO / name)
    if campaign.engine.kind == "vllm":  # the served model's tokenizer is on the GPU nodes, not here: a tiny one counts
        kwargs = {**campaign.engine.engine_kwargs, "tokenizer": str(build_tiny_tokenizer(tmp_path / "tokenizer"))}
        campaign = campaign.model_copy(update={"engine": campaign.engine.model_copy(update={"engine_kwargs": kwargs})})
    campaign.require_traffic()  # what `specdrill simulate` checks before it writes anything
    campaign.require_traffic(real_time=True)  # ... and `specdrill run`
    assert campaign.arms() and campaign.shapes


def test_the_minimal_example_simulates_to_a_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["simulate", str(REPO / "examples" / "sim-campaign.yaml"), "--output", "run"])
    assert result.exit_code == 0, result.output  # dyn-dp2's dropped schedule is reported, its gate exempt
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["passed"] and summary["exempt_arms"] == ["dyn-dp2"]
    # `off` on both topologies: every arm has a baseline on its own hardware
    assert set(summary["maps"][0]["arms"]) == {f"{p}-{t}" for p in ("off", "fixed3", "dyn") for t in ("single", "dp2")}


def test_every_shipped_real_engine_campaign_sends_a_real_data_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real engine's acceptance depends on the text: the shipped GPU campaign sends ShareGPT's conversations (the
    file `vllm bench serve` is documented with), not template text, so it gets no generated-text warning."""
    offline_sharegpt(monkeypatch, tmp_path)
    real = [load_campaign(REPO / n) for n in SHIPPED if load_campaign(REPO / n).engine.kind != "simulated"]
    assert [c.name for c in real] == ["llama8b-eagle"]
    for campaign in real:
        assert [s.dataset for s in campaign.mix.sources] == [SHAREGPT]
        assert campaign.generated_text_lines() == []
        assert {r.category for r in campaign.mix.sample(20, seed=campaign.seed)} == {"sharegpt"}
