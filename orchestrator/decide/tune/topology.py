"""Which serving topology `specdrill tune` answers for, and the campaign's traffic played on it.

The topology is part of the decision: under data parallelism vLLM drops `num_speculative_tokens_per_batch_size`
and runs the static `num_speculative_tokens` in every step (DynamicPolicy.resolve, as vLLM does), so a schedule
tuned for one engine is not what a DP group runs. The operator names the topology (`--topology`, the campaign's
own short form: single, replicas:N, data_parallel:N); otherwise it is the one the campaign's speculative arms run
on, a data-parallel one first (the largest; that is where a schedule would silently not run), then one engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.steps.prediction_check import SeedRange
from orchestrator.decide.played import AnyPolicy, CampaignTraffic
from orchestrator.plan.campaign import ArmSelection, Campaign, CampaignError
from serve_apps.arms import ArmSpec
from serve_apps.policies import Topology, parse_topology


def short_form(topology: Topology) -> str:
    """The campaign's short form: single, replicas:N, data_parallel:N."""
    return "single" if topology.kind == "single" else f"{topology.kind}:{topology.size}"


class TopologyChoice(BaseModel):
    model_config = ConfigDict(frozen=True)
    topology: Topology
    name: str  # the campaign's name for it, or its label where the campaign has none
    why: str  # "--topology" or which arms run on it

    @property
    def short(self) -> str:
        return short_form(self.topology)

    @property
    def data_parallel(self) -> bool:
        return self.topology.data_parallel_size > 1

    def schedule_topology(self) -> Topology:
        """Where a schedule runs on as many engines: N replicas behind a router instead of one DP group."""
        if not self.data_parallel:
            return self.topology
        return self.topology.model_copy(update={"kind": "replicas", "prefill_schedule_interval": 1})


def _same(a: Topology, b: Topology) -> bool:
    return (a.kind, a.size) == (b.kind, b.size)


def topology_name(campaign: Campaign, topology: Topology) -> str:
    """The campaign's name for it, else a new one that can be part of an arm name (dp2, replicas2, single)."""
    known = next((n for n, t in campaign.topologies.items() if _same(t, topology)), None)
    if known is not None:
        return known
    name = {"single": "single", "replicas": f"replicas{topology.size}"}.get(topology.kind, f"dp{topology.size}")
    return name if name not in campaign.topologies else f"{name}-tune"


def choose_topology(campaign: Campaign, requested: str | None) -> TopologyChoice:
    """`requested` (the short form) or the campaign's: ValueError where it cannot be read or is ambiguous."""
    if requested is not None:
        try:
            wanted = parse_topology(requested)
        except ValueError as exc:
            raise ValueError(f"--topology: {exc}") from None
        known = next((t for t in campaign.topologies.values() if _same(t, wanted)), wanted)
        return TopologyChoice(topology=known, name=topology_name(campaign, known), why="--topology asked for it")
    drafting = [a for a in campaign.arms() if a.policy.kind != "off"] or campaign.arms()
    found: dict[tuple[str, int], Topology] = {}
    for arm in drafting:
        found.setdefault((arm.topology.kind, arm.topology.size), arm.topology)
    parallel = [t for t in found.values() if t.data_parallel_size > 1]
    if parallel:  # the largest DP group, as recommend answers (recommend_topology.data_parallel_topology)
        chosen = max(parallel, key=lambda t: t.size)
    elif ("single", 1) in found:
        chosen = found[("single", 1)]
    elif len(found) == 1:
        chosen = next(iter(found.values()))
    else:
        names = ", ".join(f"{t.kind}:{t.size}" for t in found.values())
        raise CampaignError(f"{campaign.name}: speculative arms on {names}: say which one tune answers for with "
                            "--topology")  # fmt: skip
    name = topology_name(campaign, chosen)
    arms = sorted(a.name for a in drafting if _same(a.topology, chosen))
    return TopologyChoice(topology=chosen, name=name, why=f"the campaign's arms {', '.join(arms)} run on it")


def with_single_off(campaign: Campaign) -> Campaign:
    """The campaign with an `off` arm on one engine, which the played traffic is built from (CampaignTraffic: the
    requests do not depend on the arm), added where none of its arms is one."""
    if any(a.policy.kind == "off" and a.topology.kind == "single" for a in campaign.arms()):
        return campaign
    policies = {**campaign.policies, "tune-off": "off"}
    topologies = {**campaign.topologies, "tune-single": Topology()}
    arms = campaign.arms_only
    if arms is not None:
        arms = [*arms, ArmSelection(policy="tune-off", topology="tune-single")]
    return campaign.model_copy(update={"policies": policies, "topologies": topologies, "arms_only": arms})


def arms_on(campaign: Campaign, topology: Topology) -> list[ArmSpec]:
    return [a for a in campaign.arms() if _same(a.topology, topology)]


@dataclass
class TopologyTraffic(CampaignTraffic):
    """The campaign's traffic played on `topology`'s engines (requests round-robin over them, as the virtual
    runner plays an arm of that topology): a policy on it resolves as vLLM would there."""

    topology: Topology = field(default_factory=Topology)

    @classmethod
    def on(cls, traffic: CampaignTraffic, topology: Topology) -> TopologyTraffic:
        return cls(campaign=traffic.campaign, units=traffic.units, traffic=traffic.traffic, template=traffic.template,
                   topology=topology)  # fmt: skip

    def arm(self, name: str, policy: AnyPolicy) -> ArmSpec:
        data = super().arm(name, policy).model_dump()
        data["topology"] = self.topology.model_dump()
        return ArmSpec.model_validate(data)


class BandFigure(BaseModel):
    """The schedule (on replicas) against the static k (on the DP group) in one offered-rate band."""

    model_config = ConfigDict(frozen=True)
    band: str
    speedup: SeedRange  # the static k's per-token latency over the schedule's, paired per seed (> 1: schedule faster)
    verdict: int  # scoring.compare of the schedule against the static k: 1 faster beyond the margin, -1 slower


class StaticAnswer(BaseModel):
    """tune's answer on a data-parallel topology (decide/tune_static.py)."""

    model_config = ConfigDict(frozen=True)
    k: int  # 0: speculation off on the DP group
    topology: str  # data_parallel:N
    schedule_topology: str  # replicas:N: where the schedule would run
    speedups: dict[int, list[SeedRange]]  # per k, per band: off's per-token latency over k's on the DP group
    figures: list[BandFigure]  # the schedule against the static k, per band
    # The schedule's per-token speedup over the static k on the traffic, the bands weighted by their requests (as
    # the static k is chosen, and as recommend weighs its schedule): beyond the margin, it is worth replicas:N
    schedule_gain: float | None = None
    margin: float = 0.02
    beyond_reach: str | None  # the oracle's word on the static k above the batch the traffic reached
    # Why this k and not the best-scoring static k, where they differ (within the margin the smaller k wins)
    within: str | None = None

    @property
    def schedule_wins(self) -> bool:
        """Whether the schedule beats the static k beyond the margin on the traffic (request-weighted): within it,
        the static k is the answer whatever one band says, as the static k itself was chosen."""
        return self.schedule_gain is not None and self.schedule_gain > 1 + self.margin

    @property
    def faster_bands(self) -> list[BandFigure]:
        return [f for f in self.figures if f.verdict > 0]
