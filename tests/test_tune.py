"""specdrill tune against exhaustive search and its own rehearsal (issue 27), on a short costly-verify ramp."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.campaign import Campaign, load_campaign
from orchestrator.decide.ground_truth import costly_verify_profile, fixed_k_campaign
from orchestrator.decide.prediction import prediction_check
from orchestrator.decide.scoring import Objective, robust
from orchestrator.decide.tune import exhaustive, tune
from orchestrator.decide.tune_outputs import run_tune
from orchestrator.report import write_report
from orchestrator.simulate_campaign import simulate_campaign
from serve_apps.sim.profile import load_profile


@pytest.fixture(scope="module")
def costly(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Campaign]:
    root = tmp_path_factory.mktemp("tune")
    profile = root / "costly.yaml"
    profile.write_text(yaml.safe_dump(costly_verify_profile()))
    data = fixed_k_campaign(profile, root / "run", rate_to=24, duration_s=30)
    data["policies"] = {"off": "off", "fixed1": "fixed:1", "fixed2": "fixed:2"}
    return profile, Campaign.model_validate(data)


def test_robust_score_is_median_minus_scaled_mad() -> None:
    r = robust([1.0, 1.1, 1.3], higher_is_better=True)
    assert r.median == pytest.approx(1.1)
    assert r.score == pytest.approx(1.1 - 1.4826 * 0.1)
    assert r.noisy  # 1.4826 * 0.1 / 1.1 > 0.1
    assert not robust([1.0, 1.01, 1.02], higher_is_better=False).noisy


def test_local_search_equals_exhaustive_on_a_small_grid(costly: tuple[Path, Campaign]) -> None:
    profile_path, campaign = costly
    profile = load_profile(str(profile_path))
    local = tune(campaign, profile, seeds=2, edges=(1, 8))
    full = tune(campaign, profile, seeds=2, edges=(1, 8), search=exhaustive)
    assert full.result.candidates == 1 + 3 * 3  # off and every k in 0..2 on both segments
    assert local.result.winner == full.result.winner
    assert local.result.schedule == full.result.schedule
    assert local.result.candidates <= full.result.candidates


def test_rehearsal_validates_and_agrees_with_the_prediction(costly: tuple[Path, Campaign], tmp_path: Path) -> None:
    profile_path, campaign = costly
    out = run_tune(campaign, profile=str(profile_path), objective=Objective.parse("tpot:p50"), seeds=2,
                   out_dir=tmp_path / "tune", budget=40)  # fmt: skip
    assert out.result.candidates <= 40
    assert out.result.speculative_config is not None
    assert out.lines[0].startswith(f"searched {out.result.candidates} candidate schedules in ")
    rehearsal = load_campaign(out.files["rehearsal-campaign.yaml"])
    assert "tuned-single" in [a.name for a in rehearsal.arms()]
    store, _ = simulate_campaign(rehearsal)
    summary = write_report(store.root)
    lines = summary.prediction_check
    bands = len(out.prediction.predicted)
    assert lines[-1].startswith(f"tuned-single: the measured map agrees with the prediction in {bands} of {bands} ")
    assert all(line.endswith(": agrees") for line in lines[:-1])


def test_a_prediction_that_cannot_be_read_is_said_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "prediction.json"
    bad.write_text("{not json")
    (line,) = prediction_check(str(bad), [])
    assert line.startswith(f"prediction {bad}: ") and line.endswith(": not compared")
