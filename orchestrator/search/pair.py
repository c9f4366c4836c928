"""Which two arms `specdrill search` runs, and the campaign it runs them in: the searched arm (by arm name, or by
policy where that runs on one topology) and the `off` arm on its hardware (orchestrator/plan/baselines.py chooses
among the campaign's; where it has none on that topology the search adds one), in a copy of the campaign cut to
those two arms, without what named the others (gate exemptions, endpoint URLs) or a tune prediction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.plan.arms import arm_name
from orchestrator.plan.baselines import BaselineError, baselines
from orchestrator.plan.campaign import Campaign, CampaignError
from serve_apps.arms import ArmSpec
from serve_apps.engine_kinds.registry import kind_of


def arm_names(campaign: Campaign) -> dict[str, tuple[str, str]]:
    """Arm name -> (policy, topology): the names Campaign.arms() gives its arms."""
    return {arm_name(p, t): (p, t) for p in campaign.policies for t in campaign.topologies}


@dataclass(frozen=True)
class Pair:
    """The searched arm and the `off` arm on its hardware, as (policy, topology) names of the search's campaign.
    `added`: the campaign has no `off` arm on that topology, so the search runs one (equal hardware)."""

    arm: tuple[str, str]
    base: tuple[str, str]
    added: bool = False
    off_policy_added: bool = False  # the campaign has no `off` policy at all: the search adds one named OFF_NAME

    @property
    def arm_name(self) -> str:
        return arm_name(*self.arm)

    @property
    def base_name(self) -> str:
        return arm_name(*self.base)


def _find_arm(campaign: Campaign, arms: list[ArmSpec], name: str) -> ArmSpec:
    """--arm: an arm by name, or by its policy where that runs on one topology; else one line naming the choices."""
    names_of = arm_names(campaign)
    exact = [a for a in arms if a.name == name]
    if exact:
        return exact[0]
    by_policy = [a for a in arms if names_of[a.name][0] == name]
    if len(by_policy) == 1:
        return by_policy[0]
    if by_policy:
        raise CampaignError(f"--arm: policy {name!r} runs on several topologies; name one of its arms: "
                            f"{', '.join(a.name for a in by_policy)}")  # fmt: skip
    raise CampaignError(f"--arm: no arm or policy named {name!r} (arms: {', '.join(a.name for a in arms)})")


def _off_policies(campaign: Campaign, arms: list[ArmSpec], against: str) -> list[str]:
    """The `off` policies --against allows: the one it names, or (the default "off" naming no policy) every one."""
    kinds = {name: policy_kind(raw) for name, raw in campaign.policies.items()}
    if against in campaign.policies:
        if kinds[against] != "off":
            raise CampaignError(f"--against: policy {against!r} speculates; it must be `off`")
        return [against]
    if against != "off":
        raise CampaignError(f"--against: no arm or policy named {against!r} (arms: {', '.join(a.name for a in arms)})")
    return [p for p in campaign.policies if kinds.get(p) == "off"]


OFF_NAME = "off"


def policy_kind(raw: Any) -> str:
    """A policy's kind as the campaign writes it: the short form's first word, or a mapping's `kind`."""
    if isinstance(raw, str):
        return raw.strip().split(":")[0]
    return str(raw.get("kind", "")) if isinstance(raw, dict) else ""


def pick_pair(campaign: Campaign, arm: str, against: str = "off") -> Pair:
    """The searched arm and its `off` on equal hardware (orchestrator/plan/baselines.py chooses among the campaign's
    `off` arms). Where the campaign has no `off` arm on the arm's topology, the search adds one: a campaign
    that compares that arm per engine with a single-engine `off` is still searched on equal hardware."""
    arms = campaign.arms()
    names_of = arm_names(campaign)
    chosen = _find_arm(campaign, arms, arm)
    if chosen.policy.kind == "off":
        raise CampaignError(f"--arm: arm {chosen.name} does not speculate: there is nothing to search")
    topology = names_of[chosen.name][1]
    exact = [a for a in arms if a.name == against]
    if exact:
        base = exact[0]
        if base.policy.kind != "off":
            raise CampaignError(
                f"--against: arm {base.name} speculates (policy {base.policy.label}); it must be `off`"
            )
        if base.topology != chosen.topology:
            raise CampaignError(
                f"--against: {base.name} runs on {base.topology.label}, {chosen.name} on {chosen.topology.label}: "
                "the search compares arms on the same hardware"
            )
        return Pair(arm=names_of[chosen.name], base=names_of[base.name])
    policies = _off_policies(campaign, arms, against)
    offs = [a for a in arms if a.policy.kind == "off" and names_of[a.name][0] in policies]
    try:
        found = baselines([chosen, *offs])[chosen.name]
        if not found.normalised:
            return Pair(arm=names_of[chosen.name], base=names_of[found.baseline])
    except BaselineError:
        pass
    if not kind_of(campaign.engine).can_add_arms:
        raise CampaignError(
            f"--arm: {chosen.name} has no `off` arm on its hardware ({chosen.topology.label}) and an endpoint "
            "campaign cannot add one; add an `off` server on the same hardware to engine.urls and arms"
        )
    if policies:
        return Pair(arm=names_of[chosen.name], base=(policies[0], topology), added=True)
    if OFF_NAME in campaign.policies:
        raise CampaignError(f"--against: policy {OFF_NAME!r} speculates; name the campaign's `off` policy")
    return Pair(arm=names_of[chosen.name], base=(OFF_NAME, topology), added=True, off_policy_added=True)


def search_campaign(campaign: Campaign, pair: Pair, output: str, shapes: dict[str, dict[str, Any]]) -> Campaign:
    """The run's campaign: the original with only the two arms, the search's shapes so far, one repeat. What named
    the arms it does not run goes (gate exemptions, endpoint URLs), and so does a tune prediction (its map is
    of the original's arms and shapes)."""
    data = campaign.model_dump(mode="json", by_alias=True)
    names = {pair.arm_name, pair.base_name}
    gates = data.get("gates") or {}
    gates["exempt_arms"] = [a for a in gates.get("exempt_arms", []) if a in names]
    data["engine"] = kind_of(campaign.engine).for_arms(campaign.engine, names).model_dump(mode="json", by_alias=True)
    if pair.off_policy_added:
        data["policies"] = {**data["policies"], OFF_NAME: "off"}
        data["analysis"] = {**(data.get("analysis") or {}), "absolute_only": False}
    data.update(
        arms=[{"policy": p, "topology": t} for p, t in (pair.base, pair.arm)],
        shapes=shapes, repeats=1, output=output, gates=gates, prediction=None,
    )  # fmt: skip
    return Campaign.model_validate(data)
