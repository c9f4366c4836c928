"""`specdrill tune CAMPAIGN --design D`: each engine's design of load-dependent speculation tuned on the campaign's
own traffic, in virtual time, beside the oracle.

A design is searched over a small space projected from the simulator's oracle (the best k per batch size):
vLLM's schedule and TensorRT-LLM's (both key readings) take the oracle's schedule and its simplest form;
SGLang's adaptive steps take slots at its shipped keys with candidate lists from a small family around the
oracle's k there; TensorRT-LLM's concurrency cap a k and an N; its gate a k, a window and a threshold. Every
candidate is played on the same requests as `off` (tune's played traffic), and scored per offered-rate band by its
per-token speedup over `off` (the objective's latency quantile, median over seeds); a design's best is the
candidate with the highest geometric mean over the bands. The oracle's figure is the oracle's own schedule played
on the same traffic: what a per-batch table with the best k everywhere gives in the same frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.opmap.bands import auto_rate_bands, rate_bands_from_edges
from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.analysis.steps.prediction_check import SeedRange
from orchestrator.decide.oracle import DEFAULT_BATCH_SIZES, Oracle, oracle
from orchestrator.decide.played import AnyPolicy, CampaignTraffic
from orchestrator.decide.scoring import Cell, Objective, cells, score
from orchestrator.decide.tune.build import drafter_of, oracle_workload
from orchestrator.decide.tune.simplify import simplest_oracle_schedule
from orchestrator.decide.tune.static import smallest_within
from orchestrator.decide.tune.topology import TopologyTraffic, choose_topology, short_form, with_single_off
from orchestrator.plan.campaign import Campaign
from serve_apps.policies import OffPolicy, Topology, parse_policy
from serve_apps.policies_sglang import SglangAdaptivePolicy
from serve_apps.policy_kinds import facts, fallback_k
from serve_apps.sim.profile import Profile

Design = Literal[
    "vllm_schedule", "sglang_adaptive", "trtllm_schedule", "trtllm_max_concurrency", "trtllm_acceptance_gate"
]
DESIGNS: tuple[Design, ...] = (
    "vllm_schedule", "sglang_adaptive", "trtllm_schedule", "trtllm_max_concurrency", "trtllm_acceptance_gate"
)  # fmt: skip
SGLANG_KEYS = (1, 8, 32, 64)  # SGLang's shipped slots' lower bounds
CAP_N = (16, 32, 64, 128)
GATE = ((50, 0.2), (50, 0.3), (50, 0.5), (100, 0.3))


class DesignBest(BaseModel):
    model_config = ConfigDict(frozen=True)
    design: str
    engine: str = "vLLM"  # whose design it is
    policy: str  # the short form a campaign's `policies:` takes (SGLang's slots: its adaptive_config JSON too)
    speedups: list[float | None]  # per band, over `off` on the same engines (> 1: faster): median over seeds
    ranges: list[SeedRange]  # per band, the same over seeds: median, lowest and highest seed
    candidates: int
    # Where the topology drops the design to a static k: its engine's fallback in the findings' words, what the
    # engine says it runs instead, and the static k the best runs; None where the design runs as designed
    fallback: str | None = None
    dropped: str | None = None
    static_k: int | None = None
    within: str | None = None  # why this static k and not the best-scoring one, where they differ (plain tune's)


class DesignsResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    bands: list[str]
    best: list[DesignBest]
    oracle_schedule: list[list[int]]
    oracle_speedups: list[float | None]
    oracle_ranges: list[SeedRange] = []
    oracle_topology: str = "single"  # where the oracle's schedule is played (replicas:N for a DP group)
    topology: str = "single"  # the campaign's short form of the topology answered for
    topology_name: str = "single"
    topology_why: str = ""
    seeds: int = 1
    objective: str = "tpot p50"
    reach: int = 0  # the largest batch one engine ran under off: settings above it are the oracle's, not measured


def _ranges(schedule: Sequence[Sequence[int]], top: int) -> list[tuple[int, int, int]]:
    out = [(int(a), int(b), int(k)) for a, b, k in schedule]
    return [*out[:-1], (out[-1][0], max(out[-1][1], top), out[-1][2])]


def _schedules(truth: Oracle, top: int) -> list[list[tuple[int, int, int]]]:
    found = [_ranges(truth.schedule(), top), _ranges(simplest_oracle_schedule(truth), top)]
    return [s for i, s in enumerate(found) if s not in found[:i]]


def _families(max_k: int) -> list[Callable[[int], list[int]]]:
    """SGLang's candidate lists around the oracle's k at a slot: itself alone, one below, two either side, 0."""

    def one(k: int) -> list[int]:
        return [k]

    def below(k: int) -> list[int]:
        return sorted({max(k - 1, 0), k})

    def around(k: int) -> list[int]:
        return sorted({max(k - 2, 0), k, min(k + 2, max_k)})

    def with_zero(k: int) -> list[int]:
        return sorted({0, k})

    return [one, below, around, with_zero]


def _dynamic(max_k: int, ranges: Sequence[Sequence[int]]) -> str:
    """vLLM's schedule in a campaign's short form: `dynamic:MAX_K:A-B=K,...`."""
    return f"dynamic:{max_k}:" + ",".join(f"{a}-{b}={k}" for a, b, k in ranges)


def candidates(design: Design, truth: Oracle, max_k: int, top: int) -> list[str | dict[str, object]]:
    """The design's search space: short forms (SGLang's slots: a mapping without method and model)."""
    out: list[str | dict[str, object]] = []
    if design in ("vllm_schedule", "trtllm_schedule"):
        for ranges in _schedules(truth, top):
            ranges = [(a, b, min(k, max_k)) for a, b, k in ranges]
            high = max(k for *_, k in ranges)
            if design == "vllm_schedule":
                out.append(_dynamic(max(high, 1), ranges))
                continue
            out.append(f"trtllm_schedule:upper_bounds:{max(high, 1)}:" + ",".join(f"{b}={k}" for _, b, k in ranges))
            first = max(ranges[0][2], 1)  # the validator wants key 1 = the largest draft length
            lower = ",".join(f"{a}={min(k, first)}" for a, _, k in ranges)
            out.append(f"trtllm_schedule:lower_bounds:{first}:{lower}")
    elif design == "sglang_adaptive":
        at = {key: min(truth.best_k(key), max_k) for key in SGLANG_KEYS if key <= top}
        for family in _families(max_k):
            slots = {str(key): {"candidate_steps": family(k)} for key, k in at.items()}
            out.append({"kind": "sglang_adaptive", "num_steps": at[1], "adaptive_config": slots})
        out.append(f"sglang_adaptive:{at[1]}")  # SGLang's shipped slots
    elif design == "trtllm_max_concurrency":
        ks = sorted({min(truth.best_k(1), max_k), min(truth.best_k(32), max_k), max_k} - {0})
        out += [f"trtllm_max_concurrency:{k}:{n}" for k in ks for n in CAP_N if n <= top]
    else:
        ks = sorted({min(truth.best_k(1), max_k), min(truth.best_k(32), max_k)} - {0})
        out += [f"trtllm_acceptance_gate:{k}:{w}:{t}" for k in ks for w, t in GATE]
    return out


def _policy(spec: str | dict[str, object], method: str, model: str | None) -> AnyPolicy:
    if isinstance(spec, str):
        return parse_policy(spec, default_method=method, default_model=model)
    return SglangAdaptivePolicy.model_validate({**spec, "method": method, "model": model})


def _label(spec: str | dict[str, object]) -> str:
    if isinstance(spec, str):
        return spec
    slots = spec["adaptive_config"]
    assert isinstance(slots, dict)
    steps = ",".join(f"{key}:{slot['candidate_steps']}".replace(" ", "") for key, slot in slots.items())
    return f"sglang_adaptive:{spec['num_steps']} slots {steps}"


def _speedups(band_cells: Sequence[Cell]) -> list[SeedRange]:
    """Per band, off's latency quantile over the candidate's, per seed (scoring.cells' paired ratio, inverted)."""
    return [SeedRange.of([1 / r if math.isfinite(r) and r > 0 else math.nan for r in c.latency.per_seed])
            for c in band_cells]  # fmt: skip


def _mean_log(ranges: Sequence[SeedRange]) -> float:
    found = [math.log(r.median) for r in ranges if r.median is not None and r.median > 0]
    return sum(found) / len(found) if found else -math.inf


def static_candidates(design: Design, max_k: int, top: int) -> list[str | dict[str, object]]:
    """A design its topology drops to a static k: the k it then runs, 1..max_k, each as the design's own form
    (played as it is, the engine's fallback applies): vLLM's schedule's max k, SGLang's num_steps."""
    if design == "vllm_schedule":
        return [_dynamic(k, [(1, top, k)]) for k in range(1, max_k + 1)]
    return [f"sglang_adaptive:{k}" for k in range(1, max_k + 1)]


def _fallback(policy: AnyPolicy, topology: Topology) -> tuple[str, str, int] | None:
    """The design's fallback on `topology` (its name, what the engine runs instead, the static k), or None."""
    resolved = policy.resolve(topology)
    if not resolved.schedule_dropped:
        return None
    name = facts(policy.kind).fallback or f"{facts(policy.kind).engine}'s fallback"
    return name, resolved.dropped_reason or "", fallback_k(policy)


def tune_designs(
    campaign: Campaign, profile: Profile, designs: Sequence[Design], *, seeds: int = 1, max_k: int | None = None,
    objective: Objective | None = None, topology: str | None = None, margin: float = MapSettings().margin,
) -> DesignsResult:  # fmt: skip
    """Each design's best configuration on the campaign's traffic on the topology answered for (`topology`, the
    short form, else the campaign's: choose_topology), and the oracle's schedule on the same."""
    objective = objective or Objective()
    choice = choose_topology(campaign, topology)
    base = CampaignTraffic.of(with_single_off(campaign), seeds=seeds)
    traffic = TopologyTraffic.on(base, choice.topology)
    method, model, limit = drafter_of(traffic.campaign, profile)
    max_k = limit if max_k is None else max_k
    off = traffic.play(OffPolicy())
    edges = traffic.campaign.analysis.rate_bands
    bands = rate_bands_from_edges(edges) if edges else auto_rate_bands(off.offered_rate)
    top = profile.limits.max_num_seqs
    sizes = [b for b in DEFAULT_BATCH_SIZES if b <= top]
    truth = oracle(profile, workload=oracle_workload(traffic.campaign), max_k=max_k, batch_sizes=sizes,
                   tolerance=margin)  # fmt: skip
    schedule = [list(r) for r in _ranges(truth.schedule(), top)]
    oracle_policy = parse_policy(_dynamic(max(k for *_, k in schedule), schedule), default_method=method,
                                 default_model=model)  # fmt: skip
    counts = np.bincount(bands.assign(off.offered_rate), minlength=len(bands.bands))
    best: list[DesignBest] = []
    for design in designs:
        space = candidates(design, truth, max_k, top)
        if _fallback(_policy(space[0], method, model), choice.topology) is not None:
            # The schedules never run there: the static k the design then runs is what there is to choose
            space = static_candidates(design, max_k, top)
        played = [cells(traffic.play(_policy(s, method, model)), off, bands, objective) for s in space]
        pick = max(range(len(space)), key=lambda i: _mean_log(_speedups(played[i])))
        within = None
        policy = _policy(space[pick], method, model)
        found = _fallback(policy, choice.topology)
        if found is not None:  # plain tune's rule for a static k (recommend's), so that the two commands agree
            clean = [b for b in range(len(bands.bands)) if counts[b] and not any(c[b].noisy for c in played)]
            # static_candidates' i-th is k = i + 1, keyed by its k (smallest_within's words name it)
            scored = [score(str(i + 1), (0.0, 1, i + 1), c, clean) for i, c in enumerate(played)]
            chosen = smallest_within(scored, {b: float(counts[b]) for b in clean}, margin)
            pick = chosen.k - 1
            policy = _policy(space[pick], method, model)
            found = _fallback(policy, choice.topology)
            assert found is not None
            if chosen.best != chosen.k:
                within = chosen.words(bands.bands, margin, truth, off.max_batch)
        ranges = _speedups(played[pick])
        # A fallen-back vLLM schedule is vLLM's static k: what to set is num_speculative_tokens, no schedule
        label = f"fixed:{found[2]}" if found and facts(policy.kind).runs_on_vllm else _label(space[pick])
        best.append(DesignBest(
            design=design, engine=facts(policy.kind).engine, policy=label, speedups=[r.median for r in ranges],
            ranges=ranges, candidates=len(space), fallback=found[0] if found else None,
            dropped=found[1] if found else None, static_k=found[2] if found else None, within=within,
        ))  # fmt: skip
    # The oracle's table is a schedule: on a DP group vLLM would drop it, so it is played where one runs (as many
    # engines as replicas), against off on the group: what the best k per batch gives on these engines.
    oracle_traffic = TopologyTraffic.on(base, choice.schedule_topology())
    oracle_ranges = _speedups(cells(oracle_traffic.play(oracle_policy), off, bands, objective))
    return DesignsResult(
        bands=[b.label for b in bands.bands], best=best, oracle_schedule=schedule,
        oracle_speedups=[r.median for r in oracle_ranges], oracle_ranges=oracle_ranges,
        oracle_topology=short_form(choice.schedule_topology()),
        topology=choice.short, topology_name=choice.name, topology_why=choice.why, seeds=seeds,
        objective=objective.label,
        reach=max(1, min(off.max_batch, top)),
    )  # fmt: skip
