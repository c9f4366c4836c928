"""A simulated arm under vLLM's synthetic rejection sampling (serve_apps/sim/synthetic.py): its measured acceptance
per position, read from the trace's per-step lists, is the rates it was given, while the same-k standard arm
beside it follows the profile; the map's arm label carries the knob."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from loadshapes.trace import read_traces
from orchestrator.plan.campaign import Campaign
from orchestrator.virtual.campaign import simulate_campaign
from serve_apps.sim.profile import load_profile
from tests.tiny_campaigns import sim_campaign

RATES = [0.9, 0.6, 0.3]
CHAT = {
    "workload": {
        "name": "chat", "category": "chat",
        "prompt_tokens": {"kind": "lognormal", "median": 128, "sigma": 0.4, "low": 16, "high": 512},
        "output_tokens": {"kind": "fixed", "value": 64}, "max_tokens": 64, "ignore_eos": True,
    },
    "weight": 1,
}  # fmt: skip


def _unconditional(arm_rows: dict[str, list[list[int]]], k: int) -> tuple[list[float], int]:
    """P(the first i+1 drafts all accepted) per position, over the steps that drafted k tokens."""
    drafted = np.concatenate([np.asarray(d, dtype=np.int64) for d in arm_rows["per_step_drafted"]])
    accepted = np.concatenate([np.asarray(a, dtype=np.int64) for a in arm_rows["per_step_accepted"]])
    full = accepted[drafted == k]
    return [float(np.mean(full >= i + 1)) for i in range(k)], len(full)


def test_synthetic_arm_measures_its_rates_and_the_standard_arm_its_profile(tmp_path: Path) -> None:
    campaign = Campaign.model_validate(sim_campaign(
        "synthetic",
        policies={
            "off": "off", "fixed3": "fixed:3",
            "syn3": {"kind": "fixed", "method": "eagle", "model": "drafter", "k": 3,
                     "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": RATES},
        },
        shapes={"calm": {"kind": "quiet", "rate": 4, "duration_s": 80}},
        mix={"entries": [CHAT]}, load={"store_step_lists": True, "drain_s": 30}, output=str(tmp_path / "run"),
    ))  # fmt: skip
    store, _ = simulate_campaign(campaign)
    table = read_traces(store.traces)
    chat = load_profile("llama3.1-8b-h100-eagle").acceptance["chat"].per_position
    profile_rates = list(np.cumprod(chat[:3]))
    for arm, expected in (("syn3-single", RATES), ("fixed3-single", profile_rates)):
        rows = table.filter(pc.equal(table["arm"], arm)).select(["per_step_drafted", "per_step_accepted"])
        measured, steps = _unconditional(rows.to_pydict(), 3)
        assert steps > 5000, (arm, steps)
        for position, (got, want) in enumerate(zip(measured, expected, strict=True)):
            # within 4 binomial standard errors of the rate it should follow
            assert abs(got - want) <= 4 * math.sqrt(want * (1 - want) / steps) + 1e-9, (arm, position, got, want)
    # the two arms are told apart: the synthetic rates are not the profile's
    assert abs(RATES[0] - profile_rates[0]) > 0.1
    labels = {a.name: a.policy.label for a in campaign.arms()}
    assert labels["syn3-single"] == "fixed-eagle-k3-synthetic[0.9,0.6,0.3]"
    assert labels["fixed3-single"] == "fixed-eagle-k3"


def test_calibrate_fits_the_models_acceptance_without_the_synthetic_arm(tmp_path: Path) -> None:
    """A synthetic arm accepts at the rates it was given: calibrate fits the cost from its steps but leaves its
    acceptance out, so the fitted acceptance is the standard arms' (the profile's), and says so."""
    from orchestrator.calibrate.command import calibrate

    syn = {"kind": "fixed", "method": "eagle", "model": "drafter", "k": 3, "rejection_sample_method": "synthetic",
           "synthetic_acceptance_rates": RATES}  # fmt: skip
    campaign = Campaign.model_validate(sim_campaign(
        "synthetic-cal", policies={"off": "off", "fixed1": "fixed:1", "fixed3": "fixed:3", "syn3": syn},
        shapes={"calm": {"kind": "quiet", "rate": 4, "duration_s": 60}},
        mix={"entries": [CHAT]}, load={"store_step_lists": True, "drain_s": 30}, output=str(tmp_path / "run"),
    ))  # fmt: skip
    store, _ = simulate_campaign(campaign)
    result = calibrate([store.root], name="fitted", check=False)
    (chat,) = [a for a in result.acceptance if a.category == "chat"]
    profile = load_profile("llama3.1-8b-h100-eagle").acceptance["chat"].per_position
    assert chat.per_position == pytest.approx(profile, abs=0.03)
    assert any("arms syn3-single left out" in line for line in result.lines)
