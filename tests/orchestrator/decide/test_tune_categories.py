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


def test_tune_checks_each_band_and_says_where_a_category_is_thin(tmp_path: Path) -> None:
    """Coding accepting (0.3, 0.2, 0.1) in three offered-rate bands: 6 req/s (k = 3 costs coding nothing beyond
    the margin at its small batches), a second of 30 req/s (16 coding requests over 2 seeds: too few to judge) and
    100 req/s (batches past 100: coding ~1.2x slower than off). The answer is named as hurting coding in the busy
    band only, and the thin band is said, not judged."""
    profile = yaml.safe_load(SHIPPED.read_text())
    profile["name"] = "midcode"
    profile["acceptance"] = {"chat": {"per_position": [0.8, 0.7, 0.6]}, "coding": {"per_position": [0.3, 0.2, 0.1]}}
    profile.pop("category_map")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile))
    campaign = Campaign.model_validate(sim_campaign(
        "tunebands", engine={"kind": "simulated", "profile": str(tmp_path / "p.yaml")},
        policies={"off": "off", "k3": "fixed:3"},
        shapes={"light": {"kind": "quiet", "rate": 6, "duration_s": 40},
                "busy": {"kind": "quiet", "rate": 100, "duration_s": 15},
                "mid": {"kind": "quiet", "rate": 30, "duration_s": 1}},
        mix={"entries": [category_workload("chat", 3), category_workload("coding", 1)]}, load={"drain_s": 30},
    ))  # fmt: skip
    out = run_tune(campaign, profile=None, objective=Objective(), seeds=2, out_dir=tmp_path / "tune", budget=12,
                   max_k=3)  # fmt: skip
    checks = json.loads(Path(out.files["tune.json"]).read_text())["category_checks"]
    hurt = [line for line in checks if "hurts coding" in line]
    assert len(hurt) == 1 and hurt[0].startswith("100+ req/s: the answer helps the mix there"), checks
    assert not any("hurts chat" in line for line in checks)
    (thin,) = [line for line in checks if line.startswith("not enough requests of")]
    assert thin.startswith("not enough requests of coding in band 6.1-100 req/s (") and "30 needed" in thin, thin
    assert all(line in out.lines for line in checks)
