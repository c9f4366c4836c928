"""The arms of the campaigns `specdrill recommend` writes, matched to the runs' own arms by what they run (policy
and topology), not by name: a policy the runs already defined keeps its name (`fixed:1` named k1 stays k1), so a
follow-up re-runs the arm it had instead of adding a second name for it; and, for a data-parallel answer, the
arms on the deployment it is for: `off` and the static k on data_parallel:N (same hardware, same requests), and
the schedule on replicas:N where recommend advised keeping it there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.decide.recommend.recommendation import Recommendation
from orchestrator.decide.recommend.runs import RunEvidence
from orchestrator.plan.arms import arm_name
from orchestrator.plan.campaign import Campaign
from serve_apps.policies import FixedPolicy, Topology, parse_topology

Arms = list[tuple[str, str]]  # (policy name, topology name)


def fixed_policy(method: str, model: str | None, k: int) -> dict[str, Any]:
    return {"kind": "fixed", "method": method, **({"model": model} if model else {}), "k": k}


def arm_names(campaign: Campaign) -> dict[str, tuple[str, str]]:
    """arm name -> (policy name, topology name)."""
    pairs = (
        [(a.policy, a.topology) for a in campaign.arms_only] if campaign.arms_only is not None
        else [(p, t) for p in campaign.policies for t in campaign.topologies]
    )  # fmt: skip
    return {arm_name(p, t): (p, t) for p, t in pairs}


def named_policy(runs: Sequence[RunEvidence], policy: dict[str, Any], policies: dict[str, Any],
                 fallback: str) -> str:  # fmt: skip
    """The name under which `policy` goes into `policies` (added there): a run's own name for the same policy
    (compared as parsed, so `fixed:1` is the same as its long form) where that name is free or holds it, else
    `fallback` (made unique)."""
    wanted = FixedPolicy.model_validate(policy)
    for run in runs:
        raw = run.campaign.model_dump(mode="json", by_alias=True, exclude_none=True)["policies"]
        names = arm_names(run.campaign)
        for arm in run.campaign.arms():
            name = names[arm.name][0]
            if arm.policy == wanted and policies.get(name, raw[name]) == raw[name]:
                policies[name] = raw[name]
                return name
    name = fallback
    while name in policies and policies[name] != policy:
        name += "-rec"
    policies[name] = policy
    return name


def topology_named(runs: Sequence[RunEvidence], topology: Topology, topologies: dict[str, Any],
                   fallback: str) -> str:  # fmt: skip
    """The runs' own name for a topology of this kind and size, else `fallback` (made unique); added to
    `topologies`."""
    for run in runs:
        for name, known in run.campaign.topologies.items():
            if (known.kind, known.size) == (topology.kind, topology.size):
                topologies.setdefault(name, known.model_dump(mode="json"))
                return name
    name = fallback
    while name in topologies:
        name += "-rec"
    topologies[name] = topology.model_dump(mode="json")
    return name


def deployment_arms(
    runs: Sequence[RunEvidence], recommendation: Recommendation, off_policy: str, policies: dict[str, Any],
    topologies: dict[str, Any], *, schedule: str | None,
) -> Arms:  # fmt: skip
    """For a data-parallel answer: `off` and the static k on data_parallel:N, and `schedule` (a policy name in
    `policies`, or None) on replicas:N where recommend advised keeping the schedule there (it beats the static k
    beyond the margin); nothing for a one-engine answer. Adds what they need to `policies` and `topologies`."""
    dp = recommendation.data_parallel
    if dp is None or dp.status == "insufficient":
        return []
    topology = parse_topology(dp.topology)
    name = topology_named(runs, topology, topologies, f"dp{topology.size}")
    arms = [(off_policy, name)]
    if dp.k:
        static = named_policy(runs, fixed_policy(recommendation.method, recommendation.model, dp.k), policies,
                              f"static{dp.k}")  # fmt: skip
        arms.append((static, name))
    if schedule is not None and keeps_schedule(runs, recommendation):
        replicas = topology.model_copy(update={"kind": "replicas", "prefill_schedule_interval": 1})
        arms.append((schedule, topology_named(runs, replicas, topologies, f"replicas{topology.size}")))
    return arms


def keeps_schedule(runs: Sequence[RunEvidence], recommendation: Recommendation) -> bool:
    """Whether recommend advised replicas:N for the schedule: it beats the static k beyond the margin."""
    dp = recommendation.data_parallel
    margin = runs[0].choices[0].margin if runs[0].choices else 0.0
    return dp is not None and dp.schedule_gain is not None and dp.schedule_gain > 1 + margin


def deployment_words(runs: Sequence[RunEvidence], recommendation: Recommendation) -> str:
    """What the rehearsal runs on the deployment a data-parallel answer is for; '' for a one-engine answer."""
    dp = recommendation.data_parallel
    if dp is None or dp.status == "insufficient":
        return ""
    said = f"{f'static k = {dp.k}' if dp.k else 'speculation off'} beside off on {dp.topology}"
    if keeps_schedule(runs, recommendation):
        said += f", the schedule on replicas:{dp.topology.split(':')[1]}"
    return said + ", the schedule beside off on one engine"
