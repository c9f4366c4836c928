"""calibrate fits acceptance per category from a run that carries data-set categories: from a base profile far
from the truth (every position 0.3, and without the data set's category at all), the fitted profile gets each
measured category's own per-position acceptance back, keeps the base's fallbacks for the categories the run did
not measure, and a category the base only reached by falling back gets acceptance of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from serve_apps.sim.profile import load_profile
from tests.orchestrator.calibrate.distant import distant_base
from tests.tiny_campaigns import as_yaml, sim_campaign

TRUTH = {"chat": [0.6, 0.5, 0.4], "reasoning": [0.7, 0.6, 0.5], "editing": [0.8, 0.7, 0.62], "coding": [0.9, 0.8, 0.7]}


def _cli(*args: str) -> None:
    with pytest.raises(SystemExit) as caught:
        main(list(args))
        raise SystemExit(0)
    assert caught.value.code in (0, None), args


def _workload(category: str) -> dict[str, object]:
    return {"workload": {
        "name": category, "category": category,
        "prompt_tokens": {"kind": "lognormal", "median": 64, "sigma": 0.3, "low": 16, "high": 256},
        "output_tokens": {"kind": "fixed", "value": 128}, "max_tokens": 128,
    }, "weight": 1}  # fmt: skip


def test_acceptance_per_category_is_fitted_from_a_distant_base(tmp_path: Path) -> None:
    truth = yaml.safe_load((Path(__file__).parents[3] / "serve_apps/profiles/llama3.1-8b-h100-eagle.yaml").read_text())
    truth["name"], truth["acceptance"] = "truth", {c: {"per_position": p} for c, p in TRUTH.items()}
    (tmp_path / "truth.yaml").write_text(yaml.safe_dump(truth))
    campaign = sim_campaign(
        "calcat", engine={"kind": "simulated", "profile": str(tmp_path / "truth.yaml")},
        policies={"off": "off", "fixed1": "fixed:1", "fixed3": "fixed:3"},
        shapes={"steady": {"kind": "quiet", "rate": 4, "duration_s": 40}},
        mix={"entries": [_workload(c) for c in ("chat", "editing", "coding")]},
        load={"store_step_lists": True, "drain_s": 30},
    )  # fmt: skip
    (tmp_path / "c.yaml").write_text(as_yaml(campaign))
    _cli("simulate", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "run"), "--no-report")
    base = distant_base(tmp_path)  # every cost x3, every position 0.3; chat, editing, reasoning; coding -> chat
    assert load_profile(str(base)).resolve_category("coding") == "chat"
    _cli("calibrate", str(tmp_path / "run"), "--base", str(base), "-o", str(tmp_path / "fitted.yaml"))
    fitted = load_profile(str(tmp_path / "fitted.yaml"))
    for category in ("chat", "editing", "coding"):
        got = fitted.acceptance[category].per_position
        assert len(got) == 3
        # ~50 requests x ~60 steps a category: position 1 within ~0.02, position 3 (reached less) within ~0.04
        assert max(abs(a - b) for a, b in zip(TRUTH[category], got, strict=True)) <= 0.05, (category, got)
    assert fitted.resolve_category("coding") == "coding"  # its own now, not chat's
    assert fitted.acceptance["reasoning"].per_position == [0.3, 0.3, 0.3]  # not measured: the base's, said so
    assert fitted.default_category == "chat" and fitted.category_map == {
        "math": "reasoning",
        "math_reasoning": "reasoning",
    }
