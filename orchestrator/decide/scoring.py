"""How a candidate policy is scored per offered-rate band, and which of several candidates wins.

Per band and seed: the share of the band's requests that met the campaign's SLO (goodput: every candidate gets
the same requests, so the share orders them as goodput does) and a latency quantile (per-token latency p50 by
default) over `off`'s on the same requests (paired, so that seed-to-seed differences of the traffic cancel).
Over seeds, the robust score of vLLM's tuner (PR #49163): median minus 1.4826 MAD for what is better high
(goodput), median plus 1.4826 MAD for what is better low (latency), so a candidate that is fast on one seed only
does not win; a cell whose relative MAD exceeds 0.1 is noisy and rejected.

Comparing two candidates in a band: goodput first; only where it ties within the margin, the latency; paired per
seed (the same requests), a difference counting only when the per-seed ratio's robust range lies beyond the
analysis' margin.

The tie rule (the one rule of `tune`, printed by it and stated in docs/engineering/grading.md): the candidates tied with
the best-loss one are those not worse than it beyond the margin in any band nor slower in total (paired) by one
band's margin (log 1.02). Among them, in this order:
1. the fixed-batch oracle's k: the least speedup given up against its best k at the batch sizes the traffic
   reached, k within the oracle's own tolerance of its best (the margin) counting as none. A band mixes batch
   sizes: on the costly-verify test ramp k = 2 instead of 3 at batch 1-7 moved no band beyond the margin (gains
   at 5-7 offset losses at 1-4), where the oracle gives up 10 points of speedup at batch 1; and a batch size the
   traffic runs rarely moves no band whatever its k (the smaller-k rule alone set k = 0 at batch 24-26, the top
   of a ramp, where the oracle's best is 1);
2. the simpler schedule: fewer k changes (segments of vLLM's num_speculative_tokens_per_batch_size; speculation
   off, no schedule at all, is the simplest). A k change that neither the traffic nor the oracle can tell from
   its absence is complexity with no predicted effect, and each boundary the engine crosses costs a k switch,
   which the report measures (`tune.simplify` removes such changes after the search; the quickstart's tuned
   schedule had k = 2 at batch 16-22 with predictions equal to fixed k = 3 in every band);
3. the smaller k (the sum of k over those batch sizes): less drafting for the same predicted result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from loadshapes.experience import LATENCIES, quantile
from orchestrator.analysis.opmap.bands import BandSet
from orchestrator.decide.played import Played

MAD_SCALE = 1.4826  # MAD of a normal sample times this estimates its standard deviation
NOISY_RELATIVE_MAD = 0.1
GOODPUT_WEIGHT = 100.0  # goodput first: one margin of goodput outweighs any latency difference in the loss
_FLOOR = 1e-3


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    latency: Literal["tpot", "ttft", "e2e"] = "tpot"
    quantile: float = Field(default=0.5, gt=0, lt=1)

    @classmethod
    def parse(cls, text: str) -> Objective:
        """`tpot`, `ttft:p99`, `e2e:p90`: which latency, at which percentile (default p50)."""
        name, _, pct = text.partition(":")
        if name not in LATENCIES:
            raise ValueError(f"--objective {text!r}: the latency is one of {', '.join(LATENCIES)}")
        if not pct:
            return cls(latency=name)  # type: ignore[arg-type]
        try:
            value = float(pct.removeprefix("p"))
        except ValueError:
            raise ValueError(f"--objective {text!r}: the percentile is pNN, e.g. p50 or p99") from None
        if not 0 < value < 100:
            raise ValueError(f"--objective {text!r}: the percentile must lie between 0 and 100")
        return cls(latency=name, quantile=value / 100)  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        return f"{self.latency} p{self.quantile * 100:g}"


class Robust(BaseModel):
    model_config = ConfigDict(frozen=True)
    median: float
    score: float  # median -/+ 1.4826 MAD: the pessimistic side
    relative_mad: float
    per_seed: list[float]

    @property
    def noisy(self) -> bool:
        return self.relative_mad > NOISY_RELATIVE_MAD


def robust(values: Sequence[float], higher_is_better: bool) -> Robust:
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if not len(finite):
        return Robust(median=math.nan, score=math.nan, relative_mad=math.inf, per_seed=list(values))
    median = float(np.median(finite))
    mad = MAD_SCALE * float(np.median(np.abs(finite - median)))
    relative = mad / abs(median) if median else (0.0 if mad == 0 else math.inf)
    score = median - mad if higher_is_better else median + mad
    return Robust(median=median, score=score, relative_mad=relative, per_seed=[float(v) for v in values])


class Cell(BaseModel):
    """One candidate in one offered-rate band, over seeds."""

    model_config = ConfigDict(frozen=True)
    goodput: Robust  # share of the band's requests meeting the SLO
    latency: Robust  # the objective's latency quantile over off's on the same requests

    @property
    def noisy(self) -> bool:
        # A goodput share of 0 everywhere is not noise, it is overload: the same for every candidate.
        return self.latency.noisy or (self.goodput.median > 0 and self.goodput.noisy)


def cells(played: Played, base: Played, bands: BandSet, objective: Objective) -> list[Cell]:
    """`base` (the same traffic under `off`) pairs the latency: per band and seed, the candidate's quantile over
    the base's on the requests usable in both. Seeds are different traffic: near saturation one seed's queues
    run far longer than another's for every candidate alike, so the absolute quantile's MAD over seeds marks
    those bands noisy and leaves them unscored, while the paired ratio varies only by what the policy changes."""
    codes = bands.assign(base.offered_rate)
    seeds = sorted(set(base.seed.tolist()))
    latency, reference = played.latency[objective.latency], base.latency[objective.latency]
    both = np.isfinite(latency) & np.isfinite(reference)
    out = []
    for b in range(len(bands.bands)):
        goodputs, latencies = [], []
        for seed in seeds:
            mine = (codes == b) & (base.seed == seed)
            goodputs.append(float(played.met[mine].mean()) if mine.any() else math.nan)
            usable = mine & both
            if usable.any():
                q = objective.quantile
                latencies.append(quantile(latency[usable], q) / quantile(reference[usable], q))
            else:
                latencies.append(math.nan)
        out.append(Cell(goodput=robust(goodputs, True), latency=robust(latencies, False)))
    return out


def compare(a: Cell, b: Cell, margin: float) -> int:
    """1: a is better than b beyond the margin, -1: worse, 0: a tie. Paired: both candidates ran the same
    requests in each seed, so the comparison is of their per-seed ratio, and a difference counts only when the
    ratio's robust range over seeds (_paired) lies beyond the margin. Each candidate's own robust
    score carries its own spread over seeds, and seed-to-seed noise of the traffic is common to both: compared
    unpaired, 1.3% apart at the median (every seed within 1.4%) read as 2.2% apart (costly-verify's quietest band)."""
    goodput = _paired(a.goodput.per_seed, b.goodput.per_seed, higher_is_better=True)
    gap = abs(a.goodput.median - b.goodput.median)
    if goodput is not None and gap > _FLOOR:
        if goodput[0] > 1 + margin:
            return 1
        if goodput[1] < 1 / (1 + margin):
            return -1
    latency = _paired(a.latency.per_seed, b.latency.per_seed, higher_is_better=False)
    if latency is not None:
        if latency[0] > 1 + margin:
            return 1
        if latency[1] < 1 / (1 + margin):
            return -1
    return 0


def _seed_pairs(a: Sequence[float], b: Sequence[float]) -> list[tuple[float, float]]:
    """The two candidates' values seed by seed, where both are finite (a seed without requests in the band has
    none)."""
    return [(x, y) for x, y in zip(a, b, strict=True) if math.isfinite(x) and math.isfinite(y)]


def _paired(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool) -> tuple[float, float] | None:
    """a's advantage over b per seed (> 1: a better), as its robust range over seeds: median -/+ 1.4826 MAD,
    inside the lowest and highest seed; None without a seed where both are finite. Two zero shares are equal."""
    ratios = []
    for x, y in _seed_pairs(a, b):
        mine, theirs = (x, y) if higher_is_better else (y, x)
        if theirs == 0:
            ratios.append(1.0 if mine == 0 else math.inf)
        else:
            ratios.append(mine / theirs)
    if not ratios:
        return None
    values = np.asarray(ratios, dtype=np.float64)
    low, high = float(values.min()), float(values.max())
    if not np.isfinite(values).all():
        return low, high
    # Within the seeds' own range: with two seeds median -/+ 1.4826 MAD is wider than both (a tie where each
    # seed says worse beyond the margin, the proof's and the verdict's rule for "hurts").
    median = float(np.median(values))
    mad = MAD_SCALE * float(np.median(np.abs(values - median)))
    return max(low, median - mad), min(high, median + mad)


def loss(band_cells: Sequence[Cell], scored: Sequence[int]) -> float:
    return sum(
        GOODPUT_WEIGHT * -math.log(max(band_cells[b].goodput.score, _FLOOR)) + math.log(band_cells[b].latency.score)
        for b in scored
    )


class Scored(BaseModel):
    """A candidate with its cells, what ties are broken by (its segments: the entries of its schedule, 0 for
    speculation off; its prior: the fixed-batch oracle's speedup it gives up over the batch sizes the traffic
    reached, 0 where its k is within the oracle's tolerance of the best; then its k mass, the sum of its k over
    those batch sizes) and whether a scored band rejected it as noisy."""

    model_config = ConfigDict(frozen=True)
    key: str
    segments: int
    k_mass: int
    prior: float
    cells: list[Cell]
    loss: float
    rejected: bool

    @property
    def tie(self) -> tuple[float, int, int]:
        """The tie rule's order (module docstring): the oracle's k, then fewer segments, then the smaller k."""
        return (self.prior, self.segments, self.k_mass)

    @property
    def by_loss(self) -> tuple[float, int, str]:
        """The order of the search's climbs and of the best-loss candidate: loss, then smaller k, then the key."""
        return (self.loss, self.k_mass, self.key)


def score(
    key: str, tie: tuple[float, int, int], band_cells: list[Cell], scored: Sequence[int]
) -> Scored:  # fmt: skip
    """`tie`: (prior, segments, k mass), Scored.tie's order."""
    rejected = any(band_cells[b].noisy for b in scored) or not math.isfinite(loss(band_cells, scored))
    value = loss(band_cells, scored) if not rejected else math.inf
    prior, segments, k_mass = tie
    return Scored(key=key, segments=segments, k_mass=k_mass, prior=prior, cells=band_cells, loss=value,
                  rejected=rejected)  # fmt: skip


def paired_excess(a: Scored, b: Scored, scored: Sequence[int]) -> float:
    """How much slower a is than b over the scored bands: the sum of log(median over seeds of a's latency over
    b's on the same requests); gains in one band offset losses in another."""
    total = 0.0
    for band in scored:
        pairs = _seed_pairs(a.cells[band].latency.per_seed, b.cells[band].latency.per_seed)
        ratios = [x / y for x, y in pairs if x > 0 and y > 0]
        if ratios:
            total += math.log(float(np.median(ratios)))
    return total


def best_by_loss(candidates: Sequence[Scored]) -> Scored:
    usable = [c for c in candidates if not c.rejected]
    if not usable:
        raise ValueError("every candidate was rejected as noisy in some band: run more seeds or longer shapes")
    return min(usable, key=lambda c: c.by_loss)


def ties(candidate: Scored, best: Scored, scored: Sequence[int], margin: float) -> bool:
    """Whether `candidate` is tied with `best`: not worse beyond the margin in any scored band, and in total,
    paired, slower by less than one band's margin. The total: a seed where the best-loss candidate ran slow made
    a per-band tie of a schedule 5-10% slower on the other two (costly-verify's saturated top band, 42 req/s
    ramp), which the oracle's k then won."""
    if candidate.rejected:
        return False
    per_band = all(compare(candidate.cells[b], best.cells[b], margin) >= 0 for b in scored)
    return per_band and paired_excess(candidate, best, scored) <= math.log(1 + margin)


def winner(candidates: Sequence[Scored], scored: Sequence[int], margin: float) -> Scored:
    """The tie rule (module docstring) over the candidates tied with the best-loss one."""
    best = best_by_loss(candidates)
    tied = [c for c in candidates if ties(c, best, scored, margin)]
    return min(tied, key=lambda c: (*c.tie, c.loss, c.key))
