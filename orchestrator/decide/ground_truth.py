"""The analysis held to the simulator's ground truth (issue 15): shared by
tests/orchestrator/decide/test_ground_truth.py and benchmarks/bench_oracle.py so that the test and the benchmark make
the same comparisons at different sizes.

1. The recommended schedule against the oracle's best k per batch size (`schedule_agreement`).
2. The rehearsed recommendation against the fixed-k arms per offered-rate band, paired (`rehearsal_vs_fixed`).
3. The report's crossover for an arm against `off` against a dense open-loop sweep (`sweep_crossover`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict

from loadshapes.mixes import Workload
from loadshapes.slo import SloConfig
from orchestrator.analysis.opmap.kchoice import paired_vs
from orchestrator.analysis.opmap.operating_map import operating_maps
from orchestrator.analysis.opmap.results import MapSettings, OperatingMap, RatioCI
from orchestrator.analysis.read.db import EngineSettings
from orchestrator.analysis.read.inputs import load_run
from orchestrator.analysis.read.views import run_requests
from orchestrator.analysis.summary import offered_rate_bands, schedule_bands
from orchestrator.decide.oracle import Oracle
from orchestrator.decide.recommend.recommendation import Recommendation
from orchestrator.virtual.experiments import sweep
from serve_apps.policies import FixedPolicy, OffPolicy, ResolvedSpeculation
from serve_apps.sim.profile import Profile

SHIPPED_EAGLE = Path(__file__).resolve().parents[2] / "serve_apps" / "profiles" / "llama3.1-8b-h100-eagle.yaml"

# Short answers: many requests per second of traffic for a given batch, so the paired comparisons have enough
# requests in every band from a campaign of a minute or two of virtual time. Short prompts: in open loop every
# arrival's prefill lands in the running requests' steps, the same seconds whatever k, which dilutes the
# differences between k at low load; the oracle's batch 1 has no arrivals, so long prompts (dear on the costly
# profile: 128 tokens cost ~4 decode steps) would part it from any open-loop traffic at batch 1-2.
SHORT_CHAT: dict[str, Any] = {
    "name": "short-chat",
    "category": "chat",
    "prompt_tokens": {"kind": "lognormal", "median": 32, "sigma": 0.5, "low": 8, "high": 256},
    "output_tokens": {"kind": "lognormal", "median": 48, "sigma": 0.4, "low": 8, "high": 96},
    "max_tokens": 96,
}

# Batch bands for the fixed-k campaigns: with fixed arms only the report's bands are the default wide ones
# (1-8, 9-32, ...), coarser than the oracle's boundaries; a dynamic arm's schedule edges become the bands
# (report.schedule_bands), so this arm is there for its edges (powers of two) as much as for its evidence.
BAND_EDGES_ARM = "dynamic:4:1-2=4,3-4=3,5-8=2,9-16=2,17-32=1,33-64=0,65-512=0"


def costly_verify_profile(per_batched_token: float = 2e-4) -> dict[str, Any]:
    """The shipped H100 EAGLE profile with the target's per-token compute ten times dearer (as a larger model
    on a smaller GPU): the shipped profile keeps k = 3 helping up to batch 512 (~1.13x at 256), loads a test
    cannot reach in seconds. With verification compute-bound from batch ~10 on, every k's crossover lies at a
    few to ~20 requests/s: k = 4 is best at batch 1, 3 to ~5, 2 to ~20, 1 to ~60, then no speculation."""
    data: dict[str, Any] = yaml.safe_load(SHIPPED_EAGLE.read_text())
    data["name"] = "test-costly-verify"
    data["description"] = "test profile: llama3.1-8b-h100-eagle with 10x the per-token verify compute"
    data["verify"]["per_batched_token"] = per_batched_token
    return data


def short_chat() -> Workload:
    return Workload.model_validate(SHORT_CHAT)


FIXED_KS = range(1, 5)
# The fixed-k arms fixed_k_campaign runs (on its one topology, `single`): what the rehearsal is held against.
FIXED_ARMS = [f"fixed{k}-single" for k in FIXED_KS]


def fixed_k_campaign(
    profile: str | Path, output: str | Path, *, rate_to: float, duration_s: float, **changes: Any
) -> dict[str, Any]:
    """`off`, fixed k = 1..4 and the band-edges arm over a ramp from 1 req/s to `rate_to`, short chat."""
    data: dict[str, Any] = {
        "name": "ground-truth",
        "engine": {"kind": "simulated", "profile": str(profile)},
        "policies": {"off": "off", **{f"fixed{k}": f"fixed:{k}" for k in FIXED_KS}, "bands": BAND_EDGES_ARM},
        "topologies": {"single": "single"},
        "shapes": {"ramp": {"kind": "ramp", "rate_from": 1, "rate_to": rate_to, "duration_s": duration_s}},
        "mix": {"entries": [{"workload": SHORT_CHAT, "weight": 1}]},
        "load": {"workers": 1, "drain_s": 30},
        "seed": 0,
        "output": str(output),
    }
    data.update(changes)
    return data


# --- 1. recommended schedule vs oracle ----------------------------------------------------------------------


class BatchAgreement(BaseModel):
    model_config = ConfigDict(frozen=True)
    batch_size: int
    band: str
    recommended_k: int
    oracle_k: int
    near_best: tuple[int, ...]
    # exact: the recommended k is the oracle's (or tied within its tolerance); slack: the oracle's k within one
    # band of this batch size (a boundary off by one band); miss: neither.
    match: Literal["exact", "slack", "miss"]


def schedule_agreement(oracle: Oracle, recommendation: Recommendation) -> list[BatchAgreement]:
    """Per oracle batch size inside a band where the recommendation chose a k from evidence: the recommended
    schedule's k there against the oracle's. Batch sizes in bands nothing was chosen for are not covered."""
    chosen = [b for b in recommendation.bands if b.k is not None]
    if not chosen:
        return []
    table = _k_table(recommendation)
    band_of = {i: b for i, b in enumerate(recommendation.bands)}
    rows = []
    for point in oracle.points:
        index = next((i for i, b in band_of.items() if b.low <= point.batch_size <= b.high), None)
        if index is None or band_of[index].k is None:
            continue
        k = table(point.batch_size)
        neighbours = {
            k_
            for other in oracle.points
            for j in (index - 1, index, index + 1)
            if j in band_of and band_of[j].low <= other.batch_size <= band_of[j].high
            for k_ in other.near_best
        }
        match: Literal["exact", "slack", "miss"] = (
            "exact" if k in point.near_best else "slack" if k in neighbours else "miss"
        )
        rows.append(
            BatchAgreement(
                batch_size=point.batch_size, band=band_of[index].band, recommended_k=k, oracle_k=point.best_k,
                near_best=point.near_best, match=match,
            )
        )  # fmt: skip
    return rows


def _k_table(recommendation: Recommendation) -> Callable[[int], int]:
    if recommendation.speculative_config is None:
        return lambda _batch: 0
    resolved = ResolvedSpeculation(
        method=recommendation.method,
        num_speculative_tokens=recommendation.num_speculative_tokens,
        schedule=tuple((e[0], e[1], e[2]) for e in recommendation.schedule),
    )
    top = max(e[1] for e in recommendation.schedule)
    return lambda batch: resolved.k_for_batch(min(batch, top), top)


# --- 2. rehearsal vs fixed arms -----------------------------------------------------------------------------


class RateBandComparison(BaseModel):
    model_config = ConfigDict(frozen=True)
    band: str
    best_fixed: str | None  # the fixed arm with the shortest per-token latency here (the map's speedup vs off)
    # Each fixed arm's per-token latency over the recommended arm's, on the same requests (> 1: the
    # recommended arm is faster), with its interval
    fixed_over_recommended: dict[str, RatioCI]

    def no_worse_than_best(self, margin: float) -> bool:
        """Not slower than the best fixed arm beyond the margin: the interval is not wholly below 1 / (1 +
        margin), the verdict's own rule for 'hurts'."""
        if self.best_fixed is None:
            return True
        ratio = self.fixed_over_recommended.get(self.best_fixed)
        return ratio is not None and ratio.high is not None and ratio.high >= 1 / (1 + margin)

    def better_than(self, margin: float) -> list[str]:
        """The fixed arms it beats beyond the margin here (interval wholly above 1 + margin: 'helps')."""
        return [a for a, r in self.fixed_over_recommended.items() if r.low is not None and r.low > 1 + margin]


def rehearsal_vs_fixed(
    run_dir: str, recommended: str, fixed: Sequence[str], *, settings: MapSettings | None = None
) -> tuple[OperatingMap, list[RateBandComparison]]:
    """Per offered-rate band of the run's report map: the recommended arm against every fixed arm, paired."""
    chosen = settings or MapSettings()
    inputs = load_run(run_dir)
    units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units]
    requests = run_requests(inputs.store.root, units, settings=EngineSettings.from_env())
    try:
        rate_bands = offered_rate_bands(requests, inputs.campaign.analysis.rate_bands)
        if rate_bands is None:
            raise ValueError(f"{run_dir}: no offered rates (closed loop only)")
        band_sets = [schedule_bands(inputs.planned), rate_bands]
        maps = operating_maps(requests, inputs.arms, inputs.campaign.slo, band_sets, settings=chosen)
        rate_map = maps[1]
        comparisons = [(b, recommended, a) for b in range(len(rate_map.bands)) for a in fixed]
        ratios = paired_vs(requests, 1, comparisons, chosen)
    finally:
        requests.close()
    rows = []
    for b, band in enumerate(rate_map.bands):
        speedups = {
            c.arm: c.speedup.tpot.point
            for c in rate_map.cells
            if c.band_index == b and c.arm in fixed and c.speedup is not None and c.speedup.tpot.point is not None
        }
        best = max(speedups, key=lambda a: speedups[a]) if speedups else None
        rows.append(
            RateBandComparison(
                band=band.label,
                best_fixed=best,
                fixed_over_recommended={a: ratios[(b, a)] for a in fixed if (b, a) in ratios},
            )
        )
    return rate_map, rows


# --- 3. crossover: report vs dense sweep --------------------------------------------------------------------


def crossover_campaign(
    profile: str | Path, output: str | Path, *, rates: Iterable[float], duration_s: float
) -> dict[str, Any]:
    """`off` and fixed k = 3 under steady Poisson traffic at each rate, one shape per rate: the traffic of a
    sweep. Not a ramp: near saturation the engine's queues lag a rising rate, which a sweep does not see."""
    return fixed_k_campaign(
        profile, output, rate_to=1, duration_s=1,
        policies={"off": "off", "fixed3": "fixed:3"},
        shapes={f"r{rate:g}".replace(".", "_"): {"kind": "sustained", "rate": rate, "duration_s": duration_s}
                for rate in rates},
    )  # fmt: skip


def report_crossover(rate_map: OperatingMap, arm: str) -> tuple[float, float | None] | None:
    """The offered-rate band where the report says `arm` stops helping: (low, high); None: it never stops."""
    crossover = next((c for c in rate_map.crossovers if c.arm == arm), None)
    if crossover is None or crossover.band_index is None:
        return None
    band = rate_map.bands[crossover.band_index]
    return band.low, band.high


class SweepCrossover(BaseModel):
    model_config = ConfigDict(frozen=True)
    rates: list[float]
    speedups: list[float]  # off's median per-token latency over the arm's, per rate
    threshold: float
    crossover: float | None  # the rate where the speedup first falls to the threshold (interpolated)


def sweep_crossover(
    profile: Profile,
    k: int,
    *,
    workload: Workload,
    rates: Sequence[float],
    duration: float,
    seed: int = 0,
    margin: float = MapSettings().margin,
) -> SweepCrossover:
    """Open-loop Poisson traffic at each rate, `off` and fixed k on the same requests: where fixed k stops
    helping. Helping means what the report's verdict means: faster per token by more than the margin."""
    drafter = FixedPolicy.model_validate({"method": profile.drafter_method, "model": profile.drafter_model, "k": k})
    points = sweep(
        profile, [OffPolicy(), drafter], rates=rates, duration=duration, workload=workload, seed=seed,
        slo=SloConfig(ttft_s=1e9, tpot_s=1e9),
    )  # fmt: skip
    by_rate: dict[float, dict[str, float]] = {}
    for point in points:
        by_rate.setdefault(point.rate, {})[point.policy] = point.summary.tpot.p50 or math.nan
    ordered = sorted(by_rate)
    speedups = [by_rate[r]["off"] / by_rate[r][drafter.label] for r in ordered]
    threshold = 1 + margin
    crossover = None
    for i, s in enumerate(speedups):
        if s <= threshold:
            if i == 0:
                crossover = ordered[0]
            else:
                before = speedups[i - 1]
                crossover = float(np.interp(threshold, [s, before], [ordered[i], ordered[i - 1]]))
            break
    return SweepCrossover(rates=ordered, speedups=speedups, threshold=threshold, crossover=crossover)
