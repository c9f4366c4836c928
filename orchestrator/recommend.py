"""`specdrill recommend RUN_DIR`: aggregate (the batch-size map) -> select (per band, the k with the best
goodput among the arms that really ran it) -> build (a vLLM schedule, and a campaign that rehearses it)."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from orchestrator.analysis import OperatingMap
from orchestrator.campaign import Campaign
from orchestrator.report import Summary
from serve_apps.policies import DynamicPolicy, FixedPolicy, OffPolicy, validate_schedule


class BandChoice(BaseModel):
    model_config = ConfigDict(frozen=True)
    band: str
    low: int
    high: int
    k: int | None  # None: no arm had data in this band (the choice is inherited from the band below)
    arm: str | None
    goodput_rps: float | None
    tpot_p50_s: float | None
    candidates: dict[str, float | None]  # arm -> goodput in this band


class Recommendation(BaseModel):
    model_config = ConfigDict(frozen=True)
    method: str
    model: str | None
    num_speculative_tokens: int
    schedule: list[list[int]]  # vLLM's num_speculative_tokens_per_batch_size
    bands: list[BandChoice]
    speculative_config: dict[str, Any] | None  # None: speculation off everywhere measured is best
    message: str


def executed_k(arm_policy: OffPolicy | FixedPolicy | DynamicPolicy, low: int, high: int) -> int | None:
    """The one k an arm ran throughout a band, or None when it varies inside the band (not a clean candidate)."""
    if isinstance(arm_policy, OffPolicy):
        return 0
    if isinstance(arm_policy, FixedPolicy):
        return arm_policy.k
    table = arm_policy.resolve().k_table(max(high, 1))
    ks = set(table[low : high + 1])
    return int(ks.pop()) if len(ks) == 1 else None


def select(campaign: Campaign, batch_map: OperatingMap, dropped: set[str]) -> list[BandChoice]:
    arms = {a.name: a for a in campaign.arms()}
    cells = {(c.band_index, c.arm): c for c in batch_map.cells}
    choices: list[BandChoice] = []
    for i, band in enumerate(batch_map.bands):
        low, high = int(band.low), int(band.upper - 1) if band.high is not None else 512
        best: tuple[float, float, str, int] | None = None  # (goodput, -TPOT p50, arm, k)
        candidates: dict[str, float | None] = {}
        for name, arm in arms.items():
            if name in dropped or name not in batch_map.arms:
                continue  # an arm whose engine dropped its schedule did not run what its policy says
            cell = cells.get((i, name))
            k = executed_k(arm.policy, low, high)
            if cell is None or cell.requests < batch_map.settings.min_requests or k is None:
                continue
            candidates[name] = cell.goodput_rps
            tpot = cell.tpot_s.p50 if cell.tpot_s.p50 is not None else float("inf")
            key = (cell.goodput_rps or 0.0, -tpot, name, k)
            if best is None or key[:2] > best[:2]:
                best = key
        choices.append(
            BandChoice(
                band=band.label,
                low=low,
                high=high,
                k=best[3] if best else None,
                arm=best[2] if best else None,
                goodput_rps=best[0] if best else None,
                tpot_p50_s=-best[1] if best else None,
                candidates=candidates,
            )
        )
    return choices


def build(campaign: Campaign, choices: list[BandChoice]) -> Recommendation:
    drafters = [a.policy for a in campaign.arms() if isinstance(a.policy, FixedPolicy | DynamicPolicy)]
    method = drafters[0].method if drafters else "ngram"
    model = drafters[0].model if drafters else None
    schedule: list[list[int]] = []
    previous = 0
    for choice in choices:
        k = choice.k if choice.k is not None else previous  # no data: keep what the band below chose
        if schedule and schedule[-1][2] == k and schedule[-1][1] + 1 == choice.low:
            schedule[-1][1] = choice.high
        else:
            schedule.append([choice.low, choice.high, k])
        previous = k
    max_k = max((entry[2] for entry in schedule), default=0)
    measured = [c for c in choices if c.k is not None]
    if max_k == 0:
        return Recommendation(
            method=method,
            model=model,
            num_speculative_tokens=0,
            schedule=schedule,
            bands=choices,
            speculative_config=None,
            message="plain decoding had the best goodput in every measured band: leave it off",
        )
    validate_schedule([tuple(e) for e in schedule])
    config: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": max_k,
        "num_speculative_tokens_per_batch_size": schedule,
    }
    if model:
        config["model"] = model
    bands = ", ".join(f"{c.band}: k={c.k} ({c.arm})" for c in measured)
    return Recommendation(
        method=method,
        model=model,
        num_speculative_tokens=max_k,
        schedule=schedule,
        bands=choices,
        speculative_config=config,
        message=f"best goodput per batch band: {bands}",
    )


def rehearsal_campaign(campaign: Campaign, recommendation: Recommendation, run_dir: str) -> dict[str, Any]:
    """The measured single-engine arms plus the recommended schedule, on the same traffic, into a new run dir."""
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
    output = f"{run_dir.rstrip('/')}-recommended"
    data.update(policies=policies, arms=arms, name=f"{campaign.name}-rec"[:41], output=output)
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


def recommend(summary: Summary, campaign: Campaign, run_dir: str) -> tuple[Recommendation, dict[str, Any]]:
    batch_map = next(m for m in summary.maps if m.measure == "batch_size")
    dropped = {a.arm for a in summary.verification.arms for f in a.findings if "dropped" in f.check and not f.passed}
    recommendation = build(campaign, select(campaign, batch_map, dropped))
    return recommendation, rehearsal_campaign(campaign, recommendation, run_dir)


def vllm_snippet(recommendation: Recommendation) -> str:
    if recommendation.speculative_config is None:
        return "# no speculative_config: plain decoding\n"
    return yaml.safe_dump({"speculative_config": recommendation.speculative_config}, sort_keys=False)
