"""A campaign's policies are held to vLLM 0.32's schedule rules, and refused where vLLM would run something other
than what is written (serve_apps.policies.runnable_as_written); generated campaigns pass the same model."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.plan.campaign import Campaign, CampaignError, load_campaign
from serve_apps.config_io import load_yaml_model
from tests.tiny_campaigns import four_arms

BASE: dict[str, Any] = four_arms(
    "rules", shapes={"ramp": {"kind": "ramp", "rate_from": 1, "rate_to": 12, "duration_s": 6}},
    gates={"exempt_arms": ["dyn-dp2"]},
)


def _load(tmp_path: Path, **changes: Any) -> Campaign:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, **changes}))
    return load_campaign(path)


def _policies(**extra: Any) -> dict[str, Any]:
    return {**BASE["policies"], **extra}


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        (_policies(dyn="dynamic:3:1-4=5,5-512=0"),
         r"policies\.dyn: schedule entry \[1, 4, 5\]: k 5 is above max k 3; vLLM would silently clamp it to 3"),
        (_policies(fixed3="fixed:99"),
         r"policies\.fixed3: k 99 is above the drafter's limit of 8 draft tokens per step"),
        (_policies(dyn="dynamic:99:1-4=3,5-512=0"), r"policies\.dyn: max k 99 is above the drafter's limit of 8"),
        (_policies(dyn="dynamic:3:1-4=3,600-900=0"),
         r"policies\.dyn: schedule entry \[600, 900, 0\]: starts above max_num_seqs 512"),
        # vLLM's own refusals, in its words' sense (validate_and_normalize_dynamic_sd_schedule)
        (_policies(dyn="dynamic:3:2-4=3,5-512=0"), r"policies\.dyn: .*the first batch-size range must start at 1"),
        (_policies(dyn="dynamic:3:1-4=3,4-512=0"), r"policies\.dyn: .*overlap"),
    ],
)
def test_what_vllm_would_refuse_or_run_otherwise_is_refused(
    tmp_path: Path, policies: dict[str, Any], message: str
) -> None:
    with pytest.raises(CampaignError, match=message):
        _load(tmp_path, policies=policies)


def test_what_vllm_runs_as_written_is_accepted_as_vllm_normalises_it(tmp_path: Path) -> None:
    # Unsorted: vLLM sorts the ranges by start, and so does the policy; a last range past max_num_seqs (512 in the
    # profile) is vLLM's own doc example's form, its batch sizes above 512 never occur.
    campaign = _load(tmp_path, policies=_policies(dyn="dynamic:3:13-900=0,1-4=3,5-12=1"))
    dyn = next(a for a in campaign.arms() if a.name == "dyn-single")
    assert dyn.policy.schedule == ((1, 4, 3), (5, 12, 1), (13, 900, 0))  # type: ignore[union-attr]
    assert dyn.policy.to_vllm_speculative_config()["num_speculative_tokens_per_batch_size"] == [
        [1, 4, 3], [5, 12, 1], [13, 900, 0],
    ]  # fmt: skip
    assert _load(tmp_path, policies=_policies(fixed3="fixed:8")).arms()


def test_a_vllm_engines_max_num_seqs_bounds_the_schedule(tmp_path: Path) -> None:
    engine = {"kind": "vllm", "model": "m", "max_num_seqs": 64}
    with pytest.raises(CampaignError, match=r"\[65, 512, 0\]: starts above max_num_seqs 64"):
        _load(tmp_path, engine=engine, policies=_policies(dyn="dynamic:3:1-64=3,65-512=0"),
              topologies={"single": "single"}, arms=None, gates={})  # fmt: skip


def test_exempting_an_arm_the_campaign_does_not_have_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CampaignError, match=r"gates\.exempt_arms: no arm named dyn-dp4 \(arms: dyn-dp2, dyn-single"):
        _load(tmp_path, gates={"exempt_arms": ["dyn-dp4"]})


def test_the_generated_rehearsal_and_follow_up_campaigns_validate(tmp_path: Path) -> None:
    from rich.console import Console

    from orchestrator.analysis.read.inputs import load_run
    from orchestrator.analysis.summary import build_summary
    from orchestrator.decide.recommend.build import recommend
    from orchestrator.report.build import write_report
    from orchestrator.virtual.campaign import simulate_campaign

    # fixed3 alone beside off: the follow-up measures the k = 1 and 2 the dynamic schedule needs
    campaign = _load(tmp_path, output=str(tmp_path / "run"))
    store, _ = simulate_campaign(campaign, output=str(tmp_path / "run"))
    write_report(store.root, console=Console(file=io.StringIO()))
    inputs = load_run(store.root)
    _, rehearsal, followup = recommend(build_summary(inputs)[0], inputs.campaign, store.root)
    assert followup is not None
    for name, data in (("rehearsal", rehearsal), ("follow-up", followup)):
        loaded = load_yaml_model(yaml.safe_dump(data), Campaign, origin=name, error=CampaignError)
        loaded.require_traffic()
        assert "dyn-dp2" not in {a.name for a in loaded.arms()} and loaded.gates.exempt_arms == []


def test_a_campaign_without_off_runs_for_absolute_figures_only_when_it_says_so(tmp_path: Path) -> None:
    from rich.console import Console

    from orchestrator.report.build import write_report
    from orchestrator.virtual.campaign import simulate_campaign

    arms = [{"policy": "fixed3", "topology": "single"}, {"policy": "dyn", "topology": "single"}]
    with pytest.raises(CampaignError, match=r"set analysis: \{absolute_only: true\}"):
        _load(tmp_path, arms=arms, gates={}).require_traffic()
    with pytest.raises(CampaignError, match=r"analysis\.absolute_only: the campaign has an `off` arm"):
        _load(tmp_path, analysis={"absolute_only": True}).require_traffic()
    campaign = _load(tmp_path, arms=arms, gates={}, analysis={"absolute_only": True}, output=str(tmp_path / "run"))
    campaign.require_traffic()
    store, _ = simulate_campaign(campaign, output=str(tmp_path / "run"))
    printed = io.StringIO()
    summary = write_report(store.root, console=Console(file=printed, width=200))
    assert summary.headline[0] == "no off arm: absolute figures only (analysis.absolute_only), no speedups"
    text = printed.getvalue()
    assert text.startswith("no off arm: absolute figures only") and "no baseline" in text
    cells = [c for m in summary.maps for c in m.cells if c.requests]
    assert cells and all(c.speedup is None or c.speedup.deciding.point is None for c in cells)
    assert all(c.goodput_rps is not None for c in cells)  # the absolute figures are there
    from click.testing import CliRunner

    from orchestrator.cli import cli

    refused = CliRunner().invoke(cli, ["recommend", store.root])
    assert refused.exit_code == 2 and "no speedups to recommend from" in refused.output
