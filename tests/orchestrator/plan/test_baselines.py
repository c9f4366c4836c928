"""Which `off` arm each arm is compared with (orchestrator/plan/baselines.py), and campaigns that cannot compare."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.plan.baselines import baselines, primary_baseline
from orchestrator.plan.campaign import Campaign, CampaignError


def _campaign(topologies: dict[str, Any], arms: list[tuple[str, str]]) -> Campaign:
    return Campaign.model_validate(
        {
            "name": "fair",
            "engine": {"kind": "simulated"},
            "policies": {"off": "off", "fixed3": "fixed:3", "dyn": "dynamic:3:1-64=3,65-512=1"},
            "topologies": topologies,
            "arms": [{"policy": p, "topology": t} for p, t in arms],
            "shapes": {"q": {"kind": "quiet", "rate": 1, "duration_s": 1}},
        }
    )


def test_each_arm_is_compared_with_off_on_the_same_hardware_when_there_is_one() -> None:
    campaign = _campaign(
        {"single": "single", "dp2": "data_parallel:2", "r3": "replicas:3"},
        [("off", "single"), ("off", "dp2"), ("fixed3", "single"), ("dyn", "dp2"), ("dyn", "r3")],
    )
    campaign.require_traffic()
    found = baselines(campaign.arms())
    assert found["fixed3-single"].baseline == "off-single" and not found["fixed3-single"].normalised
    assert found["dyn-dp2"].baseline == "off-dp2" and found["dyn-dp2"].engines_ratio == 1.0  # several `off` arms
    # No `off` on three replicas: one engine's `off`, rates per engine, and the description says so.
    assert (found["dyn-r3"].baseline, found["dyn-r3"].engines_ratio) == ("off-single", 3.0)
    assert found["dyn-r3"].describe() == "dyn-r3 vs off-single per engine (3 engines against 1)"
    assert found["off-dp2"].baseline == "off-dp2"


def test_a_campaign_whose_arms_cannot_all_be_compared_is_refused_in_one_line() -> None:
    campaign = _campaign(
        {"dp2": "data_parallel:2", "tp2": {"kind": "single", "tensor_parallel_size": 2}},
        [("off", "dp2"), ("fixed3", "tp2")],
    )
    with pytest.raises(CampaignError) as caught:
        campaign.require_traffic()
    assert str(caught.value) == (
        "arms: arm fixed3-tp2 has no `off` arm to be compared with: add `off` on its topology (single-tp2, same "
        "hardware) or on single with tensor_parallel_size 2 (compared per engine)"
    )


def _infos(campaign: Campaign) -> list[ArmInfo]:
    """The arms as the report builds them (orchestrator/analysis/read/inputs.py load_run), in the campaign's order."""
    found = baselines(campaign.arms())
    return [
        ArmInfo.from_policy(a.name, a.policy, topology=a.topology, compared_with=found[a.name].baseline,
                            engines_ratio=found[a.name].engines_ratio)
        for a in campaign.arms()
    ]  # fmt: skip


@pytest.mark.parametrize("single", ["single", "zz", "a"])
def test_the_primary_baseline_is_chosen_by_hardware_not_by_name_or_order(single: str) -> None:
    """The per-engine decisions' `off` arm (recommend's evidence) is the one on one engine, whatever the
    topologies are called and in whatever order the arms come (the manifest sorts them by name)."""
    campaign = _campaign(
        {single: "single", "dp2": "data_parallel:2"},
        [("off", "dp2"), ("dyn", "dp2"), ("off", single), ("fixed3", single), ("dyn", single)],
    )
    infos = _infos(campaign)
    for order in itertools.permutations(infos):
        assert primary_baseline(list(order)) == f"off-{single}"
    # Without `off` on one engine the data-parallel one is the only baseline there is
    assert primary_baseline([a for a in infos if a.name != f"off-{single}"]) == "off-dp2"
    assert primary_baseline([a for a in infos if not a.baseline]) is None


def test_between_two_engines_of_one_kind_the_one_most_arms_are_compared_with_is_primary() -> None:
    campaign = _campaign(
        {"a": "single", "b": {"kind": "single", "tensor_parallel_size": 2}},
        [("off", "a"), ("off", "b"), ("fixed3", "b"), ("dyn", "b")],
    )
    infos = _infos(campaign)
    for order in itertools.permutations(infos):
        assert primary_baseline(list(order)) == "off-b"
