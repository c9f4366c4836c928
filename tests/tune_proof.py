"""`specdrill tune` held to its claims (issue 27): shared by tests/orchestrator/decide/test_tune_proof.py and
benchmarks/bench_tune.py so that the test and the benchmark make the same comparisons at different sizes. Test
code, not product code: tune never grades itself with these.

1. The tuned schedule against every fixed k and against vLLM's documented example schedule, per offered-rate band
   of the campaign's own traffic, paired over seeds (`versus`): no worse than the band's best fixed k, better
   than each comparison somewhere.
2. The local search against exhaustive search of a coarser space (`within_margin`).
3. The tuned schedule's k at every batch size 1-256 against the fixed-batch oracle's best k there (`oracle_gaps`),
   the oracle measured at a grid of batch sizes and its per-token latency interpolated in between.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.opmap.bands import BandSet
from orchestrator.analysis.steps.prediction_check import SeedRange
from orchestrator.decide.oracle import Oracle
from orchestrator.decide.played import CampaignTraffic, Played
from orchestrator.decide.scoring import Scored, compare
from orchestrator.decide.tune.prediction import seed_ratios
from serve_apps.policies import DynamicPolicy, FixedPolicy, ResolvedSpeculation

# vLLM's documentation example of num_speculative_tokens_per_batch_size: k = 3 to batch 64, 1 to 128, then off.
VLLM_EXAMPLE = [[1, 64, 3], [65, 128, 1], [129, 512, 0]]
VLLM_EXAMPLE_ARM = "vllm-example"
GAP_LIMIT = 0.03  # three points of speedup over off


def comparison_arms(traffic: CampaignTraffic, method: str, model: str | None, max_k: int) -> dict[str, Played]:
    """Fixed k = 1..max_k and vLLM's example schedule, played through the traffic."""
    drafter = {"method": method, "model": model}
    played = {f"fixed{k}": traffic.play(FixedPolicy.model_validate({**drafter, "k": k})) for k in range(1, max_k + 1)}
    example = DynamicPolicy.model_validate({**drafter, "max_k": 3, "schedule": VLLM_EXAMPLE})
    played[VLLM_EXAMPLE_ARM] = traffic.play(example)
    return played


def share_ratios(base: Played, arm: Played, bands: BandSet) -> list[list[float]]:
    """Per band, per seed: the arm's share of requests meeting the SLO over the base's (1 where both are 0)."""
    codes = bands.assign(base.offered_rate)
    out = []
    for band in range(len(bands.bands)):
        row = []
        for seed in sorted(set(base.seed.tolist())):
            mine = (codes == band) & (base.seed == seed)
            if not mine.any():
                row.append(math.nan)
                continue
            a, b = float(arm.met[mine].mean()), float(base.met[mine].mean())
            row.append(1.0 if a == b else (a / b if b > 0 else math.inf))
        out.append(row)
    return out


class Versus(BaseModel):
    """The tuned schedule against one arm in one band, over seeds (> 1: the tuned schedule is better)."""

    model_config = ConfigDict(frozen=True)
    band: str
    arm: str
    speedup: SeedRange  # the arm's per-token latency over the tuned schedule's, paired per seed
    goodput: SeedRange  # the tuned schedule's SLO-met share over the arm's

    def worse(self, margin: float) -> bool:
        """Slower or short of goodput beyond the margin on every seed: the verdict's rule for 'hurts'."""
        return any(r.high is not None and r.high < 1 / (1 + margin) for r in (self.speedup, self.goodput))

    def better(self, margin: float) -> bool:
        """Faster or more goodput beyond the margin on every seed, and not worse in the other."""
        wins = any(r.low is not None and r.low > 1 + margin for r in (self.speedup, self.goodput))
        return wins and not self.worse(margin)

    def text(self) -> str:
        return f"{self.arm} {self.speedup.text()} (goodput {self.goodput.text()})"


class BandProof(BaseModel):
    model_config = ConfigDict(frozen=True)
    band: str
    best_fixed: str  # the fixed k with the best median per-token speedup over off in this band
    rows: dict[str, Versus]

    def no_worse_than_best(self, margin: float) -> bool:
        return not self.rows[self.best_fixed].worse(margin)


def versus(off: Played, tuned: Played, arms: dict[str, Played], bands: BandSet) -> list[BandProof]:
    speedups = {name: seed_ratios(played, tuned, bands) for name, played in arms.items()}
    goodputs = {name: share_ratios(played, tuned, bands) for name, played in arms.items()}
    over_off = {name: seed_ratios(off, played, bands) for name, played in arms.items() if name.startswith("fixed")}
    out = []
    for b, band in enumerate(bands.bands):
        medians = {name: SeedRange.of(values[b]).median for name, values in over_off.items()}
        best = max(medians, key=lambda n: medians[n] or -math.inf)
        rows = {
            name: Versus(band=band.label, arm=name, speedup=SeedRange.of(speedups[name][b]),
                         goodput=SeedRange.of(goodputs[name][b]))
            for name in arms
        }  # fmt: skip
        out.append(BandProof(band=band.label, best_fixed=best, rows=rows))
    return out


def better_somewhere(proofs: Sequence[BandProof], arm: str, margin: float) -> list[str]:
    """The bands where the tuned schedule beats `arm` beyond the margin."""
    return [p.band for p in proofs if p.rows[arm].better(margin)]


def within_margin(mine: Scored, best: Scored, bands: Sequence[int], margin: float) -> list[int]:
    """The scored bands where `mine` is worse than `best` beyond the margin (the tuner's own comparison)."""
    return [b for b in bands if compare(mine.cells[b], best.cells[b], margin) < 0]


class Gap(BaseModel):
    model_config = ConfigDict(frozen=True)
    batch: int
    k: int  # the schedule's
    best_k: int  # the oracle's at this batch size
    gap: float  # the best k's speedup over off minus the schedule's k's


def oracle_gaps(truth: Oracle, schedule: list[list[int]] | None, top: int, up_to: int = 256) -> list[Gap]:
    """At every batch size 1..up_to: the best k's speedup over off minus the schedule's k's (Oracle.speedups_at:
    interpolated between the oracle's measured batch sizes)."""
    out = []
    for batch in range(1, up_to + 1):
        speedup = truth.speedups_at(batch)
        best = max(speedup, key=lambda k: (speedup[k], -k))
        k = min(k_at(schedule, batch, top), truth.max_k)
        out.append(Gap(batch=batch, k=k, best_k=best, gap=speedup[best] - speedup[k]))
    return out


def worst_gap(gaps: Sequence[Gap]) -> Gap:
    return max(gaps, key=lambda g: (g.gap, -g.batch))


def k_at(schedule: Sequence[Sequence[int]] | None, batch: int, top: int) -> int:
    if schedule is None:
        return 0
    max_k = max(e[2] for e in schedule)
    resolved = ResolvedSpeculation(method="x", num_speculative_tokens=max(1, max_k),
                                   schedule=tuple((e[0], e[1], e[2]) for e in schedule))  # fmt: skip
    return resolved.k_for_batch(min(batch, top), top)
