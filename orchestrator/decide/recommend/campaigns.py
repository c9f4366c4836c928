"""The campaigns `specdrill recommend` writes beside its recommendation: one that rehearses what was recommended
(the schedule on one engine; for a data-parallel answer also the static k beside `off` on data_parallel:N, and the
schedule on replicas:N where recommend advised it), and a follow-up that measures what is missing beside the
current best, on the deployment the answer is for too. Both on the same traffic as the first run, their arms the
runs' own where they run the same policy (recommend_deployment.py), and validated as `specdrill run` would before
they are written."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import yaml

from loadshapes.campaign_files import RECORDED
from orchestrator.decide.recommend.deployment import arm_names, deployment_arms, fixed_policy, named_policy
from orchestrator.decide.recommend.recommendation import Recommendation
from orchestrator.decide.recommend.runs import RunEvidence
from orchestrator.plan.arms import arm_name
from orchestrator.plan.campaign import Campaign, CampaignError
from serve_apps.config_io import load_yaml_model
from serve_apps.policies import DynamicPolicy, FixedPolicy

MAX_REPEATS = 100  # the campaign's own limit
# The follow-up's shape that drives the engine past the batch the runs measured; a run set that already ran it gets
# no second one (the engine may hold no more: the loop ends, and the part above stays "inherited, not measured").
REACH_SHAPE = "past-measured"
REACH_FACTOR = 4.0  # the follow-up aims at this many times the highest measured batch (within max_num_seqs)


def followup_campaign(runs: Sequence[RunEvidence], recommendation: Recommendation) -> dict[str, Any] | None:
    """On the same traffic, one engine: `off`, the arms behind the current choices (so the follow-up run measures
    the current best beside what is new), the dynamic policies (their edges are the batch bands, so the two runs'
    evidence combines), a fixed-k arm for every k some band with requests has no verdict-sized evidence of (never
    measured there, or too thin: recommend keeps one run's candidate per band and k, it does not pool them), the
    runs' own arm where one ran that k (matched by policy, not by name: never a second name for a policy the runs
    ran), the repeats a band short of requests needs, and, for a data-parallel answer, `off` and the static k on
    that data_parallel:N (the deployment the answer is for). None when nothing is missing."""
    first = runs[0]
    if max(r.max_k for r in runs) == 0:  # no speculative arm: what is missing is not more of the same
        return None
    chosen = {(c.run, c.arm) for b in recommendation.bands if b.status != "insufficient" for c in b.candidates
              if c.speculative and (c.vs_best is None or c.k == b.k)}  # fmt: skip
    specs = {(r.run_dir, a.name): a.policy for r in runs for a in r.campaign.arms()}
    kept = {p.k for key in chosen if isinstance(p := specs[key], FixedPolicy)}
    unmeasured = {k for b in recommendation.bands if b.requests for k in b.unmeasured_k if k > 0}
    missing = sorted(unmeasured - kept)
    # more_repeats is counted from the run that gave the band its requests: any is beyond what that run had.
    more = max((b.more_repeats or 0 for b in recommendation.bands), default=0)
    reach = _reach_shape(runs, recommendation)
    if not missing and not more and reach is None:
        return None
    repeats = max(first.repeats, more)
    data = first.campaign.model_dump(mode="json", by_alias=True, exclude_none=True)
    names = {r.run_dir: arm_names(r.campaign) for r in runs}
    raw = {r.run_dir: r.campaign.model_dump(mode="json", by_alias=True, exclude_none=True) for r in runs}
    off_policy, topology, topology_data = _one_engine_baseline(first, recommendation.off_arm)
    policies: dict[str, Any] = {off_policy: data["policies"][off_policy]}
    topologies: dict[str, Any] = {topology: topology_data}
    arms = [(off_policy, topology)]
    for run_dir, arm in sorted(chosen):  # candidates run on the baseline's engine: its topology
        policy_name, _ = names[run_dir][arm]
        policies.setdefault(policy_name, raw[run_dir]["policies"][policy_name])
        arms.append((policy_name, topology))
    dynamic = [names[first.run_dir][a.name][0] for a in first.campaign.arms() if isinstance(a.policy, DynamicPolicy)]
    for name in dict.fromkeys(dynamic):
        policies.setdefault(name, data["policies"][name])
        arms.append((name, topology))
    for k in missing:  # the runs' own arm where one ran this k (`fixed:1` named k1 stays k1), else fixed{k}
        policy = fixed_policy(recommendation.method, recommendation.model, k)
        arms.append((named_policy(runs, policy, policies, f"fixed{k}"), topology))
    # The deployment the answer is for: off and the static k on data_parallel:N (not counted as one-engine
    # evidence: the follow-up measures them there, beside the one-engine arms that decide the bands).
    arms += deployment_arms(runs, recommendation, off_policy, policies, topologies, schedule=None)
    unique = list(dict.fromkeys(arms))
    if reach is not None:
        data["shapes"] = {**data["shapes"], REACH_SHAPE: reach}
    data.update(
        policies=policies, topologies=topologies, arms=[{"policy": p, "topology": t} for p, t in unique],
        repeats=min(repeats, MAX_REPEATS), name=f"{first.campaign.name}-followup"[:41],
        output=f"{first.run_dir}-followup" + (str(len(runs)) if len(runs) > 1 else ""),
    )  # fmt: skip
    return _validated(_exempt_only_its_arms(data), "the follow-up campaign")


def _reach_shape(runs: Sequence[RunEvidence], recommendation: Recommendation) -> dict[str, Any] | None:
    """A ramp from the highest rate the `off` arm was offered to REACH_FACTOR times it, as long as the campaign's
    longest shape, where the runs' load left batch sizes above the highest measured one without evidence: at the
    same requests per second of engine time a batch grows at least in proportion to the rate (Little's law, and
    each step is slower at a larger batch), so the ramp's top drives the engine past REACH_FACTOR times the
    batch the runs reached, or to saturation. None where nothing lies beyond, or a run already ran it."""
    first = runs[0]
    beyond = [b for b in recommendation.bands if b.extent == "beyond_measured" or (b.requests == 0 and b.k is None)]
    top = max((b.measured_high for b in recommendation.bands if b.measured_high is not None), default=None)
    rate = max((r.batches.peak_rate for r in runs if r.batches.peak_rate), default=None)
    if not beyond or top is None or rate is None or any(REACH_SHAPE in r.campaign.shapes for r in runs):
        return None
    if not any(b.low > top for b in beyond):
        return None
    target = min(REACH_FACTOR * top, max(b.high for b in beyond))
    duration = max(_duration(first, name) for name in first.campaign.shapes)
    return {"kind": "ramp", "rate_from": round(rate, 3), "rate_to": round(rate * max(target / top, 1.5), 3),
            "duration_s": round(duration, 3)}  # fmt: skip


def _duration(run: RunEvidence, shape: str) -> float:
    """The shape's length; a replay whose trace is gone since the run: its longest unit's, as the run measured."""
    try:
        return run.campaign.shapes[shape].duration
    except ValueError:
        units = run.summary.units if run.summary is not None else []
        return max((u.duration_s for u in units if u.unit.shape == shape), default=0.0)


def _one_engine_baseline(run: RunEvidence, off_arm: str | None) -> tuple[str, str, Any]:
    """(off policy, topology name, topology) the follow-up measures on: the run's `off` arm where it runs one
    engine, else one engine of its tensor parallelism (a schedule is per engine, and recommend counts only arms
    on one engine: a follow-up on data parallelism would never be counted, and the loop would not end)."""
    campaign = run.campaign
    names = arm_names(campaign)
    off = [a for a in campaign.arms() if a.policy.kind == "off"]
    chosen = next((a for a in off if a.name == off_arm), None) or min(
        off, key=lambda a: (a.topology.kind != "single", a.topology.tensor_parallel_size, a.name)
    )
    off_policy, topology = names[chosen.name]
    if chosen.topology.kind == "single":
        return off_policy, topology, campaign.topologies[topology].model_dump(mode="json")
    tp = chosen.topology.tensor_parallel_size
    same = [n for n, t in campaign.topologies.items() if t.kind == "single" and t.tensor_parallel_size == tp]
    if same:
        return off_policy, same[0], campaign.topologies[same[0]].model_dump(mode="json")
    name = "single" if "single" not in campaign.topologies else "one-engine"
    return off_policy, name, {"kind": "single", "size": 1, "tensor_parallel_size": tp}


def rehearsal_campaign(runs: Sequence[RunEvidence], recommendation: Recommendation) -> dict[str, Any] | None:
    """The first run's one-engine arms (and its `off` on one engine) plus the recommended schedule, on the same
    traffic, into a new run dir; for a data-parallel answer also `off` and the static k on data_parallel:N, and
    the schedule on replicas:N where recommend advised it. None where no schedule is recommended (there is
    nothing to rehearse)."""
    if recommendation.speculative_config is None:
        return None
    first = runs[0]
    campaign = first.campaign
    data = campaign.model_dump(mode="json", by_alias=True, exclude_none=True)
    policies = dict(data["policies"])
    policies["recommended"] = {
        "kind": "dynamic",
        "method": recommendation.method,
        "max_k": recommendation.num_speculative_tokens,
        "schedule": recommendation.schedule,
        **({"model": recommendation.model} if recommendation.model else {}),
    }
    # On the one engine the schedule is for: the `off` arm there and the run's other arms on one engine.
    off_policy, topology, topology_data = _one_engine_baseline(first, recommendation.off_arm)
    data["topologies"] = {**data.get("topologies", {}), topology: topology_data}
    arms = [{"policy": off_policy, "topology": topology}] + [
        {"policy": p, "topology": t}
        for name, (p, t) in arm_names(campaign).items()
        if campaign.topologies[t].kind == "single" and (p, t) != (off_policy, topology)
    ]
    arms.append({"policy": "recommended", "topology": topology})
    topologies = data["topologies"]
    deployed = deployment_arms(runs, recommendation, off_policy, policies, topologies, schedule="recommended")
    arms += [{"policy": p, "topology": t} for p, t in deployed]
    data.update(policies=policies, topologies=topologies, arms=arms, name=f"{campaign.name}-rec"[:41],
                output=f"{first.run_dir}-recommended")  # fmt: skip
    return _validated(_exempt_only_its_arms(data), "the rehearsal campaign")


def _exempt_only_its_arms(data: dict[str, Any]) -> dict[str, Any]:
    """A generated campaign keeps the gates of the one it came from, minus exemptions of arms it does not run
    (a campaign exempting an arm it has not is refused)."""
    names = {arm_name(a["policy"], a["topology"]) for a in data["arms"]}
    gates = data.get("gates", {})
    if gates.get("exempt_arms"):
        data["gates"] = {**gates, "exempt_arms": [a for a in gates["exempt_arms"] if a in names]}
    return data


def _validated(data: dict[str, Any], what: str) -> dict[str, Any]:
    """A generated campaign is checked as `specdrill run` would check it before it is written. Its files are the
    recorded run's (campaign_files.RECORDED): a data set moved since is read, and named, when it is run."""
    text = yaml.safe_dump(data, sort_keys=False)
    campaign = load_yaml_model(text, Campaign, origin=what, error=CampaignError, context={RECORDED: True})
    if not files_gone(data):  # a replay's trace moved since the run cannot be sized now: it is when it is run
        campaign.require_traffic()
    return data


def files_gone(data: dict[str, Any]) -> list[str]:
    """The local files the campaign names (replay traces, data sets) that are not there now."""
    paths: list[str] = []
    for shape in (data.get("shapes") or {}).values():
        if isinstance(shape, dict) and shape.get("kind") == "replay":
            named = shape.get("path")
            paths += [named] if isinstance(named, str) else [p for p in named or [] if isinstance(p, str)]
    mix = data.get("mix") or {}
    entries = [mix, *(e for e in mix.get("datasets") or [] if isinstance(e, dict))]
    paths += [e["dataset"] for e in entries if isinstance(e.get("dataset"), str)]
    return [p for p in paths if "://" not in p and not p.startswith("hf:") and not os.path.exists(p)]
