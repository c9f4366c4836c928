"""A policy played through a campaign's own traffic in virtual time, without writing a run directory: the
virtual executor's units (orchestrator/virtual/executor.py, play_unit) and their trace rows, judged by
loadshapes.experience and kept in memory as per-request arrays for the searches (tune, search) to score
thousands of candidate schedules on.

Every policy sees the same requests in the same order (request i of every (shape, repeat) is the same request
for every policy, as in a campaign), so two Played of one Traffic pair by position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadshapes.experience import LATENCIES, Felt, felt
from orchestrator.plan.campaign import Campaign, CampaignError
from orchestrator.rundir.layout import Unit
from orchestrator.virtual.campaign import require_simulated
from orchestrator.virtual.executor import play_unit
from orchestrator.virtual.traffic import Traffic, traffic_of
from orchestrator.virtual.twins import arm_model
from serve_apps.arms import ArmSpec
from serve_apps.policies import AnyPolicy as AnyPolicy
from serve_apps.policies import Topology


@dataclass(frozen=True)
class Played:
    """One value per request of the campaign's open-loop traffic, every unit in turn (units in Traffic order)."""

    seed: np.ndarray  # the repeat: each repeat is its own traffic and engine seed
    offered_rate: np.ndarray  # req/s, the shape's rate at the request's scheduled offset
    ok: np.ndarray
    met: np.ndarray  # ok and within the campaign's SLO: counts toward goodput
    latency: dict[str, np.ndarray]  # tpot / ttft / e2e seconds, NaN where not measured
    max_batch: int  # the largest batch any step of the policy's engines ran
    category: np.ndarray  # the request's workload category (str), for the per-category check of an answer


@dataclass
class CampaignTraffic:
    """The open-loop units of a campaign (every shape, `seeds` repeats) and their requests, built once."""

    campaign: Campaign
    units: list[tuple[str, int]]
    traffic: dict[tuple[str, int], Traffic]
    template: ArmSpec  # the off arm on one engine: every candidate is this arm with another policy

    @classmethod
    def of(cls, campaign: Campaign, seeds: int | None = None) -> CampaignTraffic:
        require_simulated(campaign)
        campaign.require_traffic()
        if seeds is not None:
            # Seeds are draws of the traffic: each its own, whatever the campaign's repeats replay.
            load = campaign.load.model_copy(update={"repeat_traffic": "fresh"})
            campaign = campaign.model_copy(update={"repeats": seeds, "load": load})
        off = [a for a in campaign.arms() if a.policy.kind == "off" and a.topology.kind == "single"]
        if not off:
            raise CampaignError("arms: no `off` arm on one engine (topology single) to play the traffic against")
        shapes = [name for name, shape in campaign.shapes.items() if shape.open_loop]
        if not shapes:
            raise CampaignError("shapes: no open-loop shape (offered rates are what the search is scored by)")
        units = [(shape, repeat) for shape in shapes for repeat in range(campaign.repeats)]
        traffic = {
            (shape, repeat): traffic_of(
                campaign, off[0], Unit(arm=off[0].name, shape=shape, repeat=repeat), run="tune", traces=""
            )
            for shape, repeat in units
        }
        return cls(campaign=campaign, units=units, traffic=traffic, template=off[0])

    def arm(self, name: str, policy: AnyPolicy) -> ArmSpec:
        data = self.template.model_dump()
        data.update(name=name, policy=policy.model_dump(), topology=Topology().model_dump())
        return ArmSpec.model_validate(data)

    def play(self, policy: AnyPolicy, name: str = "candidate-single") -> Played:
        """The policy on one engine through every unit, as the virtual executor plays a unit (play_unit)."""
        arm = self.arm(name, policy)
        model = arm_model(arm)
        parts: list[Felt] = []
        seeds: list[np.ndarray] = []
        categories: list[np.ndarray] = []
        max_batch = 0
        for shape_name, repeat in self.units:
            unit = Unit(arm=arm.name, shape=shape_name, repeat=repeat)
            traffic = self.traffic[(shape_name, repeat)]
            outcome, table = play_unit(self.campaign, model, unit, traffic.plans, traffic, run="tune", start_ns=0,
                                       stored=False)  # fmt: skip
            for core in outcome.cores:
                batches = core.steps.column("batch_size")
                if len(batches):
                    max_batch = max(max_batch, int(batches.max()))
            parts.append(felt(table, self.campaign.slo))
            seeds.append(np.full(table.num_rows, repeat, np.int32))
            categories.append(np.asarray(table.column("category").to_pylist(), dtype=object))
        merged = Felt.concat(parts)
        return Played(
            seed=np.concatenate(seeds), offered_rate=merged.offered_rate, ok=merged.ok, met=merged.met,
            latency={name: getattr(merged, name) for name in LATENCIES}, max_batch=max_batch,
            category=np.concatenate(categories),
        )  # fmt: skip


def drafter_arms(campaign: Campaign) -> Sequence[ArmSpec]:
    """The campaign's single-engine arms that draft: what a tuned schedule is compared with."""
    return [a for a in campaign.arms() if a.topology.kind == "single" and a.policy.kind != "off"]
