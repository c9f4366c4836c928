"""tune checks its answer per workload category, on the profile where chat accepts much (0.8, 0.7, 0.6) and
coding little (0.1, 0.05, 0.05), in a light 3:1 chat/coding mix: the answer speculates (it helps the mix), and
coding's requests, paying the draft steps for ~0.1 token a step, are slower than off: tune names coding, with its
range over seeds; the chat requests are not named."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.decide.scoring import Objective
from orchestrator.decide.tune.outputs import run_tune
from orchestrator.plan.campaign import Campaign
from tests.orchestrator.decide.test_recommend_categories import SHIPPED, category_workload
from tests.tiny_campaigns import sim_campaign


def test_tune_names_the_category_its_answer_hurts(tmp_path: Path) -> None:
    profile = yaml.safe_load(SHIPPED.read_text())
    profile["name"] = "lowcode"
    profile["acceptance"] = {"chat": {"per_position": [0.8, 0.7, 0.6]}, "coding": {"per_position": [0.1, 0.05, 0.05]}}
    profile.pop("category_map")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile))
    campaign = Campaign.model_validate(sim_campaign(
        "tunecats", engine={"kind": "simulated", "profile": str(tmp_path / "p.yaml")},
        policies={"off": "off", "k3": "fixed:3"},
        shapes={"light": {"kind": "quiet", "rate": 6, "duration_s": 40}},
        mix={"entries": [category_workload("chat", 3), category_workload("coding", 1)]}, load={"drain_s": 30},
    ))  # fmt: skip
    out = run_tune(campaign, profile=None, objective=Objective(), seeds=2, out_dir=tmp_path / "tune", budget=12,
                   max_k=3)  # fmt: skip
    assert out.result.speculative_config is not None  # the answer speculates: it helps the mix
    hurt = [line for line in out.lines if "hurts coding" in line]
    assert len(hurt) == 1 and "helps the mix" in hurt[0] and "over 2 seeds" in hurt[0], out.lines
    assert not any("hurts chat" in line for line in out.lines)
    slower = float(hurt[0].split("per-token latency ")[1].split("x")[0])
    assert 1.1 < slower < 1.5, hurt[0]  # the cost model's ~1.2-1.35x, as recommend measured on this profile
    assert json.loads(Path(out.files["tune.json"]).read_text())["category_checks"][1:] == hurt
