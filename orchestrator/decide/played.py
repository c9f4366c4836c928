"""A policy played through a campaign's own traffic in virtual time, without writing a run directory: the
virtual-time runner's units (orchestrator/virtual/) and its trace rows, kept in memory as per-request
arrays for the searches (tune, search) to score thousands of candidate schedules on.

Every policy sees the same requests in the same order (request i of every (shape, repeat) is the same request
for every policy, as in a campaign), so two Played of one Traffic pair by position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.plan.campaign import Campaign, CampaignError
from orchestrator.rundir.layout import Unit
from orchestrator.virtual.campaign import require_simulated
from orchestrator.virtual.rows import RowContext, trace_table
from orchestrator.virtual.traffic import Traffic, play, traffic_of
from orchestrator.virtual.twins import arm_model
from serve_apps.arms import ArmSpec
from serve_apps.policies import DynamicPolicy, FixedPolicy, OffPolicy, Topology

LATENCIES = ("tpot", "ttft", "e2e")
AnyPolicy = OffPolicy | FixedPolicy | DynamicPolicy


@dataclass(frozen=True)
class Played:
    """One value per request of the campaign's open-loop traffic, every unit in turn (units in Traffic order)."""

    seed: np.ndarray  # the repeat: each repeat is its own traffic and engine seed
    offered_rate: np.ndarray  # req/s, the shape's rate at the request's scheduled offset
    ok: np.ndarray
    met: np.ndarray  # ok and within the campaign's SLO: counts toward goodput
    latency: dict[str, np.ndarray]  # tpot / ttft / e2e seconds, NaN where not measured
    max_batch: int  # the largest batch any step of the policy's engines ran


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
        arm = self.arm(name, policy)
        model = arm_model(arm)
        campaign = self.campaign
        parts: list[dict[str, np.ndarray]] = []
        max_batch = 0
        for shape_name, repeat in self.units:
            unit = Unit(arm=arm.name, shape=shape_name, repeat=repeat)
            traffic = self.traffic[(shape_name, repeat)]
            open_loop = campaign.shapes[shape_name].open_loop
            outcome = play(model, unit, traffic.plans, traffic, campaign.load.drain_s, open_loop=open_loop)
            for core in outcome.cores:
                batches = core.steps.column("batch_size")
                if len(batches):
                    max_batch = max(max_batch, int(batches.max()))
            ctx = RowContext.of(campaign, arm, shape_name, repeat, run="tune", start_ns=0, time_scale=model.time_scale,
                                stored=False)  # fmt: skip
            table = trace_table(ctx, outcome, model.engines)
            parts.append(_columns(table, campaign, repeat))
        merged = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
        return Played(
            seed=merged["seed"], offered_rate=merged["offered_rate"], ok=merged["ok"], met=merged["met"],
            latency={name: merged[name] for name in LATENCIES}, max_batch=max_batch,
        )  # fmt: skip


def _columns(table: object, campaign: Campaign, repeat: int) -> dict[str, np.ndarray]:
    import pyarrow as pa

    assert isinstance(table, pa.Table)
    n = table.num_rows
    ok = np.asarray(table.column("status").to_pylist(), dtype=object) == "ok"
    values = {
        name: np.asarray(table.column(f"{name}_s").to_numpy(zero_copy_only=False), dtype=np.float64)
        for name in LATENCIES
    }
    values = {name: np.where(ok, v, np.nan) for name, v in values.items()}
    tpot = values["tpot"]
    # The report's usable per-token latency: an ok request with more than one token (tpot > 0).
    values["tpot"] = np.where(tpot > 0, tpot, np.nan)
    categories = table.column("category").to_pylist()
    met = np.fromiter(
        (
            bool(ok[i])
            and campaign.slo.met(
                categories[i],
                ok=True,
                ttft_s=_opt(values["ttft"][i]),
                tpot_s=_opt(tpot[i]),
                e2e_s=_opt(values["e2e"][i]),
            )
            for i in range(n)
        ),
        bool,
        n,
    )
    rates = np.asarray(table.column("offered_rate_rps").to_numpy(zero_copy_only=False), dtype=np.float64)
    return {"seed": np.full(n, repeat, np.int32), "offered_rate": rates, "ok": ok, "met": met, **values}


def _opt(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def drafter_arms(campaign: Campaign) -> Sequence[ArmSpec]:
    """The campaign's single-engine arms that draft: what a tuned schedule is compared with."""
    return [a for a in campaign.arms() if a.topology.kind == "single" and a.policy.kind != "off"]
