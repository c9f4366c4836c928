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

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.opmap.bands import BandSet, auto_rate_bands, rate_bands_from_edges
from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.decide.oracle import DEFAULT_BATCH_SIZES, Oracle, oracle
from orchestrator.decide.played import AnyPolicy, CampaignTraffic, Played
from orchestrator.decide.scoring import Objective, cells
from orchestrator.decide.tune.build import drafter_of, oracle_workload
from orchestrator.decide.tune.simplify import simplest_oracle_schedule
from orchestrator.decide.tune.topology import with_single_off
from orchestrator.plan.campaign import Campaign
from serve_apps.policies import OffPolicy, parse_policy
from serve_apps.policies_sglang import SglangAdaptivePolicy
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
    policy: str  # the short form a campaign's `policies:` takes (SGLang's slots: its adaptive_config JSON too)
    speedups: list[float | None]  # per band, over `off` (> 1: faster); None: no request there
    candidates: int


class DesignsResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    bands: list[str]
    best: list[DesignBest]
    oracle_schedule: list[list[int]]
    oracle_speedups: list[float | None]


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


def candidates(design: Design, truth: Oracle, max_k: int, top: int) -> list[str | dict[str, object]]:
    """The design's search space: short forms (SGLang's slots: a mapping without method and model)."""
    out: list[str | dict[str, object]] = []
    if design in ("vllm_schedule", "trtllm_schedule"):
        for ranges in _schedules(truth, top):
            ranges = [(a, b, min(k, max_k)) for a, b, k in ranges]
            high = max(k for *_, k in ranges)
            if design == "vllm_schedule":
                out.append(f"dynamic:{max(high, 1)}:" + ",".join(f"{a}-{b}={k}" for a, b, k in ranges))
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


def ratio(speedup: float | None) -> str:
    return "-" if speedup is None else f"{speedup:.2f}x"


def _speedups(played: Played, off: Played, bands: BandSet, objective: Objective) -> list[float | None]:
    out: list[float | None] = []
    for cell in cells(played, off, bands, objective):
        ratio = cell.latency.median
        out.append(1 / ratio if math.isfinite(ratio) and ratio > 0 else None)
    return out


def _mean_log(speedups: Sequence[float | None]) -> float:
    found = [math.log(s) for s in speedups if s is not None]
    return sum(found) / len(found) if found else -math.inf


def tune_designs(
    campaign: Campaign, profile: Profile, designs: Sequence[Design], *, seeds: int = 1, max_k: int | None = None,
    objective: Objective | None = None,
) -> DesignsResult:  # fmt: skip
    """Each design's best configuration on the campaign's traffic, and the oracle's schedule on the same."""
    objective = objective or Objective()
    traffic = CampaignTraffic.of(with_single_off(campaign), seeds=seeds)
    method, model, limit = drafter_of(traffic.campaign, profile)
    max_k = limit if max_k is None else max_k
    off = traffic.play(OffPolicy())
    edges = traffic.campaign.analysis.rate_bands
    bands = rate_bands_from_edges(edges) if edges else auto_rate_bands(off.offered_rate)
    top = profile.limits.max_num_seqs
    sizes = [b for b in DEFAULT_BATCH_SIZES if b <= top]
    truth = oracle(profile, workload=oracle_workload(traffic.campaign), max_k=max_k, batch_sizes=sizes,
                   tolerance=MapSettings().margin)  # fmt: skip
    schedule = [list(r) for r in _ranges(truth.schedule(), top)]
    oracle_policy = parse_policy(
        f"dynamic:{max(k for *_, k in schedule)}:" + ",".join(f"{a}-{b}={k}" for a, b, k in schedule),
        default_method=method, default_model=model,
    )  # fmt: skip
    best: list[DesignBest] = []
    for design in designs:
        space = candidates(design, truth, max_k, top)
        scored = [(_label(s), _speedups(traffic.play(_policy(s, method, model)), off, bands, objective)) for s in space]
        label, speedups = max(scored, key=lambda ls: _mean_log(ls[1]))
        best.append(DesignBest(design=design, policy=label, speedups=speedups, candidates=len(space)))
    return DesignsResult(
        bands=[b.label for b in bands.bands], best=best, oracle_schedule=schedule,
        oracle_speedups=_speedups(traffic.play(oracle_policy), off, bands, objective),
    )  # fmt: skip


def words(result: DesignsResult, margin: float = MapSettings().margin) -> list[str]:
    """Each design's best with its per-band speedups, the oracle's beside them, and per band the winner (designs
    within `margin` of it tie) and how far it is ahead of the next design beyond the margin."""
    lines = [f"each design's best on this traffic (per-token speedup over off per offered-rate band: "
             f"{', '.join(result.bands)} req/s):"]  # fmt: skip
    for found in result.best:
        per_band = ", ".join(ratio(s) for s in found.speedups)
        lines.append(f"  {found.design}: {found.policy} ({found.candidates} tried): {per_band}")
    lines.append(f"  oracle (best k per batch, {result.oracle_schedule}): "
                 + ", ".join(ratio(s) for s in result.oracle_speedups))  # fmt: skip
    for i, band in enumerate(result.bands):
        ranked = sorted(((s, f.design) for f in result.best if (s := f.speedups[i]) is not None), reverse=True)
        if not ranked:
            continue
        (top, winner), rest = ranked[0], ranked[1:]
        tied = [d for s, d in rest if top / s <= 1 + margin]
        ahead = [(s, d) for s, d in rest if top / s > 1 + margin]
        lead = f"{winner}, {', '.join(tied)} tie within {margin:.0%}" if tied else f"{winner} wins"
        beyond = f", {top / ahead[0][0]:.2f}x ahead of {ahead[0][1]}" if ahead else ""
        lines.append(f"  {band} req/s: {lead} ({ratio(top)} over off{beyond})")
    return lines
