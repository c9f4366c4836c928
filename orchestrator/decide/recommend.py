"""`specdrill recommend RUN_DIR`: the report's evidence (summary.json's k_choices: per batch band, every k some arm
executed there compared on the same requests) -> a vLLM schedule, a campaign that rehearses it, and a follow-up
campaign for the loads where some k was never measured (instead of guessing there)."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.kchoice import BandChoice
from orchestrator.campaign import Campaign
from orchestrator.report import Summary
from serve_apps.policies import DynamicPolicy, FixedPolicy, validate_schedule


class Recommendation(BaseModel):
    model_config = ConfigDict(frozen=True)
    method: str
    model: str | None
    num_speculative_tokens: int
    schedule: list[list[int]]  # vLLM's num_speculative_tokens_per_batch_size
    bands: list[BandChoice]  # per band: the choice, its evidence (n, ratio, interval) and a confidence word
    not_measured: list[str]  # bands where some k in 0..max_k was never measured (see the follow-up campaign)
    speculative_config: dict[str, Any] | None  # None: speculation off everywhere measured is best
    message: str


def build(campaign: Campaign, choices: list[BandChoice]) -> Recommendation:
    """The schedule from the bands' choices; a band without a choice keeps the band below's k (vLLM's own rule
    for gaps) and is listed as not measured."""
    drafters = [a.policy for a in campaign.arms() if isinstance(a.policy, FixedPolicy | DynamicPolicy)]
    method = drafters[0].method if drafters else "ngram"
    model = drafters[0].model if drafters else None
    schedule: list[list[int]] = []
    previous: int | None = None
    for choice in choices:
        k = choice.k if choice.k is not None else previous
        if k is None:
            continue  # nothing measured from batch 1 up to here: the first measured band starts the schedule
        low = 1 if not schedule else choice.low
        if schedule and schedule[-1][2] == k:
            schedule[-1][1] = choice.high
        else:
            schedule.append([low, choice.high, k])
        previous = k
    not_measured = [c.band for c in choices if c.k is None or c.unmeasured_k]
    max_k = max((entry[2] for entry in schedule), default=0)
    lines = [c.message for c in choices]
    if not schedule or max_k == 0:
        said = "no k > 0 was measured in any band" if not schedule else "k = 0 was best in every measured band"
        return Recommendation(
            method=method, model=model, num_speculative_tokens=0, schedule=schedule, bands=choices,
            not_measured=not_measured, speculative_config=None,
            message=f"{said}: leave speculation off\n" + "\n".join(lines),
        )  # fmt: skip
    validate_schedule([tuple(e) for e in schedule])
    config: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": max_k,
        "num_speculative_tokens_per_batch_size": schedule,
    }
    if model:
        config["model"] = model
    return Recommendation(
        method=method, model=model, num_speculative_tokens=max_k, schedule=schedule, bands=choices,
        not_measured=not_measured, speculative_config=config,
        message="per batch band, the smallest k within the margin of the fastest, on the same requests:\n"
        + "\n".join(lines),
    )  # fmt: skip


def followup_campaign(campaign: Campaign, recommendation: Recommendation, run_dir: str) -> dict[str, Any] | None:
    """Fixed-k arms for every k some band never measured, on the same traffic (the loads that reached those
    bands), on one engine with `off`; None when every band measured every k."""
    missing = sorted({k for c in recommendation.bands for k in c.unmeasured_k if k > 0})
    if not missing:
        return None
    data = campaign.model_dump(mode="json", by_alias=True, exclude_none=True)
    drafter: dict[str, Any] = {"method": recommendation.method}
    if recommendation.model:
        drafter["model"] = recommendation.model
    policies: dict[str, Any] = {"off": "off", **{f"fixed{k}": {"kind": "fixed", **drafter, "k": k} for k in missing}}
    data.update(
        policies=policies, topologies={"single": "single"},
        arms=[{"policy": name, "topology": "single"} for name in policies],
        name=f"{campaign.name}-followup"[:41], output=f"{run_dir.rstrip('/')}-followup",
    )  # fmt: skip
    return _exempt_only_its_arms(data)


def rehearsal_campaign(campaign: Campaign, recommendation: Recommendation, run_dir: str) -> dict[str, Any] | None:
    """The measured single-engine arms plus the recommended schedule, on the same traffic, into a new run dir;
    None where there is nothing to rehearse (no single-engine arm measured and no schedule recommended): a
    campaign of no arms would not validate."""
    data = campaign.model_dump(mode="json", by_alias=True, exclude_none=True)
    policies = dict(data["policies"])
    if recommendation.speculative_config is not None:
        policies["recommended"] = {
            "kind": "dynamic",
            "method": recommendation.method,
            "model": recommendation.model,
            "max_k": recommendation.num_speculative_tokens,
            "schedule": recommendation.schedule,
        }
    singles = [name for name, t in campaign.topologies.items() if t.data_parallel_size == 1]
    topology = singles[0] if singles else "single"
    if not singles:
        data.setdefault("topologies", {})["single"] = "single"
    arms = [{"policy": a.policy_name, "topology": a.topology_name} for a in _single_arms(campaign)]
    if recommendation.speculative_config is not None:
        arms.append({"policy": "recommended", "topology": topology})
    if not arms:
        return None
    output = f"{run_dir.rstrip('/')}-recommended"
    data.update(policies=policies, arms=arms, name=f"{campaign.name}-rec"[:41], output=output)
    return _exempt_only_its_arms(data)


def _exempt_only_its_arms(data: dict[str, Any]) -> dict[str, Any]:
    """A generated campaign keeps the gates of the one it came from, minus exemptions of arms it does not run
    (a campaign exempting an arm it has not is refused)."""
    names = {f"{a['policy']}-{a['topology']}" for a in data["arms"]}
    gates = data.get("gates", {})
    if gates.get("exempt_arms"):
        data["gates"] = {**gates, "exempt_arms": [a for a in gates["exempt_arms"] if a in names]}
    return data


class _ArmRef(BaseModel):
    policy_name: str
    topology_name: str


def _single_arms(campaign: Campaign) -> list[_ArmRef]:
    refs = []
    for policy_name in campaign.policies:
        for topology_name, topology in campaign.topologies.items():
            if topology.data_parallel_size == 1 and (
                campaign.arms_only is None
                or any(a.policy == policy_name and a.topology == topology_name for a in campaign.arms_only)
            ):
                refs.append(_ArmRef(policy_name=policy_name, topology_name=topology_name))
    return refs


def recommend(
    summary: Summary, campaign: Campaign, run_dir: str
) -> tuple[Recommendation, dict[str, Any] | None, dict[str, Any] | None]:
    """The recommendation, its rehearsal campaign, and a follow-up campaign where some k was never measured."""
    recommendation = build(campaign, summary.k_choices)
    return (
        recommendation,
        rehearsal_campaign(campaign, recommendation, run_dir),
        followup_campaign(campaign, recommendation, run_dir),
    )


def vllm_snippet(recommendation: Recommendation) -> str:
    if recommendation.speculative_config is None:
        return "# no speculative_config: plain decoding\n"
    return yaml.safe_dump({"speculative_config": recommendation.speculative_config}, sort_keys=False)
