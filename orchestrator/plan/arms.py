"""A campaign's arms: every (policy, topology) pair it runs (all, or those its `arms:` picks), each policy read
against the engine (a simulated engine drafts with its profile's drafter) and checked runnable as written.

Built once per loaded campaign (Campaign.arms() keeps them): every later step is handed the same arms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from serve_apps.arms import ArmSpec, EngineConfig
from serve_apps.config_io import first_error
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.policies import PolicyError, Topology, parse_policy, runnable_as_written
from serve_apps.resources import Resources
from serve_apps.sim.profile import Profile

DEFAULT_MAX_NUM_SEQS = 512  # vLLM's default, which the simulated profiles share


@dataclass(frozen=True)
class CampaignArms:
    """What a campaign's arms are derived with, and the arms."""

    arms: tuple[ArmSpec, ...]
    profile: Profile | None  # the simulated engine's profile; None for other kinds
    max_num_seqs: int  # the engines': the profile's or the engine's where the campaign sets it, else 512


def arm_name(policy: str, topology: str) -> str:
    """The name Campaign.arms() gives the arm of a policy on a topology (its traces, markers and flags use it)."""
    return f"{policy}-{topology}"


def engine_profile(engine: EngineConfig) -> Profile | None:
    simulation = kind_of(engine).simulation(engine)
    return simulation.profile if simulation is not None else None


def engine_max_num_seqs(engine: EngineConfig, profile: Profile | None) -> int:
    if profile is not None:
        return profile.limits.max_num_seqs
    return kind_of(engine).max_num_seqs(engine) or DEFAULT_MAX_NUM_SEQS


def build_arms(
    *,
    campaign: str,
    engine: EngineConfig,
    policies: Mapping[str, Any],
    topologies: Mapping[str, Topology],
    picks: Sequence[tuple[str, str]] | None,
    resources: Resources,
) -> CampaignArms:
    """The arms of the campaign named `campaign`; `picks`: its `arms:` (policy, topology) pairs, None for all.
    A ValueError names the campaign key at fault."""
    profile = engine_profile(engine)
    # A simulated engine drafts with its profile's drafter; elsewhere the short form means n-gram (no model).
    method, drafter = (profile.drafter_method, profile.drafter_model) if profile else ("ngram", None)
    max_num_seqs = engine_max_num_seqs(engine, profile)
    drafter_limit = profile.limits.max_draft_tokens if profile else None
    wanted = None
    if picks is not None:
        wanted = set()
        for i, (policy_name, topology_name) in enumerate(picks):
            if policy_name not in policies:
                raise ValueError(f"arms.{i}: no policy named {policy_name!r}")
            if topology_name not in topologies:
                raise ValueError(f"arms.{i}: no topology named {topology_name!r}")
            wanted.add((policy_name, topology_name))
    arms = []
    for policy_name, raw in policies.items():
        # A policy is the CLI short form ("fixed:3") or a mapping in vLLM's terms ({kind: dynamic, ...}).
        policy: Any = raw
        if isinstance(raw, str):
            try:
                policy = parse_policy(raw, default_method=method, default_model=drafter)
            except PolicyError as exc:
                raise ValueError(f"policies.{policy_name}: {exc}") from None
        for topo_name, topology in topologies.items():
            if wanted is not None and (policy_name, topo_name) not in wanted:
                continue
            data: dict[str, Any] = {
                "name": arm_name(policy_name, topo_name),
                "campaign": campaign,
                "policy": policy,
                "topology": topology,
                "engine": engine,
                "resources": resources,
            }
            try:
                arms.append(ArmSpec.model_validate(data))
            except ValidationError as exc:
                raise ValueError(f"policies.{policy_name} on topologies.{topo_name}: {first_error(exc)}") from None
            try:
                runnable_as_written(arms[-1].policy, max_num_seqs=max_num_seqs, max_draft_tokens=drafter_limit)
            except PolicyError as exc:
                raise ValueError(f"policies.{policy_name}: {exc}") from None
    return CampaignArms(tuple(arms), profile, max_num_seqs)
