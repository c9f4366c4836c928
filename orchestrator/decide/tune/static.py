"""`specdrill tune`'s answer for a data-parallel topology: the best STATIC k.

A vLLM DP group ignores `num_speculative_tokens_per_batch_size` and runs `num_speculative_tokens` in every step,
so what there is to choose is that one k. Each k in 0..max_k is played on the DP group itself (the campaign's
traffic, round-robin over its ranks, in virtual time) and scored as every tune candidate is (scoring: per
offered-rate band against `off` on the same engines, paired per seed). The answer is `recommend`'s rule for a
static k, so the two commands agree: among the static k within the margin of the best-scoring one on the
campaign's traffic (per-token latency paired per seed, its median per band, the bands weighted by their requests
as recommend weights them; goodput no worse beyond the margin in any band), the smallest. Within the margin the
traffic does not tell them apart, and the smaller k drafts less and loses less as load grows: the oracle's best
k falls with the batch (the worked example: k = 3 1.3% behind k = 4 on two engines at batch 1-24, where the
oracle puts k = 4 3.0% slower at batch 32). The schedule tune found for the same number of
engines as replicas (where vLLM keeps it) is then held against that k on the traffic by the same measure (its
bands weighted by their requests, recommend's schedule gain), with the figure per band: where it is faster beyond
the margin, the answer says by how much and that keeping it means N replicas behind a router instead of DP.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from orchestrator.analysis.opmap.bands import Band
from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.analysis.opmap.speedup import weighted_log_mean
from orchestrator.analysis.steps.prediction_check import SeedRange
from orchestrator.decide.oracle import Oracle
from orchestrator.decide.played import AnyPolicy, Played
from orchestrator.decide.scoring import Scored, best_by_loss, cells, compare, score
from orchestrator.decide.tune.build import OFF, Evaluator, Tuned, tune
from orchestrator.decide.tune.prediction import seed_ratios
from orchestrator.decide.tune.topology import BandFigure, StaticAnswer, TopologyChoice, TopologyTraffic
from orchestrator.plan.campaign import Campaign
from serve_apps.policies import FixedPolicy, OffPolicy
from serve_apps.sim.profile import Profile


def static_policy(k: int, method: str, model: str | None) -> AnyPolicy:
    return OffPolicy() if k == 0 else FixedPolicy.model_validate({"method": method, "model": model, "k": k})


def static_answer(ev: Evaluator, choice: TopologyChoice, schedule_key: str, truth: Oracle, margin: float) -> tuple[
        StaticAnswer, dict[int, Played]]:  # fmt: skip
    """The best static k on the DP group and the schedule `schedule_key` (ev's, played on replicas) against it."""
    traffic = TopologyTraffic.on(ev.traffic, choice.topology)
    space = ev.space
    played: dict[int, Played] = {}
    what = f"playing {space.max_k + 1} static k (0-{space.max_k}) on {choice.short}"
    ev.progress.stage(what)
    for k in range(space.max_k + 1):
        played[k] = traffic.play(static_policy(k, ev.method, ev.model))
        ev.progress.step(what, k + 1, space.max_k + 1, always=True)
    scored: list[Scored] = []
    for k, run in played.items():
        table = (k,) * len(space.edges)
        tie = (space.prior(table), 0 if k == 0 else 1, space.k_mass(table))
        band_cells = cells(run, played[0], ev.bands, ev.objective)
        scored.append(score(str(k), tie, band_cells, ev.scored_bands))
    counts = np.bincount(ev.bands.assign(played[0].offered_rate), minlength=len(ev.bands.bands))
    weights = {b: float(counts[b]) for b in ev.scored_bands}
    picked = smallest_within(scored, weights, margin)
    k = picked.k
    figures = []
    gain = None
    if schedule_key != OFF:
        mine = cells(ev.played[schedule_key], played[0], ev.bands, ev.objective)
        ratios = seed_ratios(played[k], ev.played[schedule_key], ev.bands, ev.objective.latency)
        static = scored[k].cells
        figures = [
            BandFigure(band=band.label, speedup=SeedRange.of(ratios[b]),
                       verdict=compare(mine[b], static[b], margin) if b in ev.scored_bands else 0)
            for b, band in enumerate(ev.bands.bands)
        ]  # fmt: skip
        gain = weighted_gain(ratios, weights)
    speedups = {j: [SeedRange.of(r) for r in seed_ratios(played[0], run, ev.bands)] for j, run in played.items()}
    answer = StaticAnswer(
        k=k, topology=choice.short, schedule_topology=f"replicas:{choice.topology.size}", speedups=speedups,
        figures=figures, schedule_gain=gain, margin=margin,
        beyond_reach=beyond_reach(truth, k, played[k].max_batch, margin),
        within=picked.words(ev.bands.bands, margin, truth, played[k].max_batch) if picked.best != k else None,
    )  # fmt: skip
    return answer, played


@dataclass(frozen=True)
class WithinMargin:
    """The static k chosen, the best-scoring one, and the chosen one's per-token latency over the best's."""

    k: int
    best: int
    over_best: float  # request-weighted over the scored bands (geometric mean of the per-band medians)
    per_band: dict[int, float]  # band index -> median over seeds of the chosen k's latency over the best's

    def words(self, bands: Sequence[Band], margin: float, truth: Oracle, reach: int) -> str:
        """Why the chosen k and not the best-scoring one, with the traffic's and the oracle's figures."""
        worst = max(self.per_band, key=lambda b: self.per_band[b])
        said = (
            f"{_k(self.k)}, not {_k(self.best)} (the best-scoring static k): within {self.over_best - 1:.1%} of it "
            f"per token on the campaign's traffic (its bands weighted by their requests; at most "
            f"{self.per_band[worst] - 1:.1%}, in {bands[worst].label} req/s), inside the {margin:.0%} margin, where "
            f"the smaller k wins, as in recommend: it drafts less and loses less as load grows"
        )
        for point in truth.points:
            if point.batch_size <= reach or max(self.k, self.best) > truth.max_k:
                continue
            slower = point.tpot_p50_s[self.best] / point.tpot_p50_s[self.k] - 1
            if slower > margin:
                return (f"{said}: the simulator's fixed-batch oracle puts {_k(self.best)} {slower:.1%} slower per "
                        f"token than {_k(self.k)} at batch {point.batch_size} per engine")  # fmt: skip
        return said


def _k(k: int) -> str:
    return "speculation off" if k == 0 else f"k = {k}"


def smallest_within(scored: Sequence[Scored], weights: dict[int, float], margin: float) -> WithinMargin:
    """recommend's rule for a static k (recommend_topology.answer): the smallest k whose per-token latency over
    the best-scoring k's, each band's median over seeds (paired: the same requests) weighted by the band's
    requests, is within the margin, its goodput no worse beyond the margin in any band (goodput first, as every
    tune score). `scored`: per static k, keyed by k."""
    best = best_by_loss(scored)
    total = sum(weights.values())
    found: dict[int, WithinMargin] = {}
    for candidate in scored:
        if candidate.rejected:
            continue
        per_band: dict[int, float] = {}
        fewer_met = False
        for b in weights:
            mine, theirs = candidate.cells[b], best.cells[b]
            ratios = [x / y for x, y in zip(mine.latency.per_seed, theirs.latency.per_seed, strict=True)
                      if math.isfinite(x) and math.isfinite(y) and y > 0]  # fmt: skip
            met = [x / y for x, y in zip(mine.goodput.per_seed, theirs.goodput.per_seed, strict=True)
                   if math.isfinite(x) and math.isfinite(y) and y > 0]  # fmt: skip
            fewer_met |= bool(met) and statistics.median(met) < 1 / (1 + margin)
            if ratios:
                per_band[b] = statistics.median(ratios)
        counted = {b: w for b, w in weights.items() if b in per_band}
        if fewer_met or not counted or not total:
            continue
        over = math.exp(weighted_log_mean((w, per_band[b]) for b, w in counted.items()))
        found[int(candidate.key)] = WithinMargin(k=int(candidate.key), best=int(best.key), over_best=over,
                                                 per_band=per_band)  # fmt: skip
    chosen = min((k for k, f in found.items() if f.over_best <= 1 + margin), default=int(best.key))
    return found.get(chosen) or WithinMargin(k=chosen, best=chosen, over_best=1.0, per_band={})


def weighted_gain(ratios: Sequence[Sequence[float]], weights: dict[int, float]) -> float | None:
    """The schedule's per-token speedup over the static k on the traffic: per band the median over seeds of the
    paired ratio, the bands weighted by their requests (recommend's schedule gain, the same measure the static k
    was chosen by); None without a band to weigh."""
    medians = {b: statistics.median(r) for b in weights if (r := [x for x in ratios[b] if math.isfinite(x) and x > 0])}
    counted = {b: weights[b] for b in medians if weights[b] > 0}
    if not counted:
        return None
    return math.exp(weighted_log_mean((w, medians[b]) for b, w in counted.items()))


def beyond_reach(truth: Oracle, k: int, reach: int, margin: float) -> str | None:
    """Above the batch the traffic reached the DP group still runs k in every step: the fixed-batch oracle's
    first measured batch size beyond the reach where another k is faster than k beyond its tolerance, or None."""
    for point in truth.points:
        if point.batch_size <= reach or k > truth.max_k or k in point.near_best:
            continue
        best = point.best_k
        slower = point.tpot_p50_s[k] / point.tpot_p50_s[best] - 1
        if slower > margin:
            return (
                f"above batch {reach} (its engines never ran larger batches on this traffic) the simulator's "
                f"fixed-batch oracle, not this traffic, puts static k = {k} {slower:.1%} slower per token than "
                f"k = {best} at batch {point.batch_size} per engine: if load grows there, tune a campaign that "
                "reaches it"
            )
    return None


def tune_on(campaign: Campaign, profile: Profile, choice: TopologyChoice, *, margin: float = MapSettings().margin,
            **options: Any) -> Tuned:  # fmt: skip
    """tune answering for `choice`: its schedule search on the topology's engines (N replicas for a DP group),
    and on a DP group the best static k as the answer, with that search's schedule held against it."""
    tuned = tune(campaign, profile, topology=choice.schedule_topology(), margin=margin, **options)
    update: dict[str, Any] = {"topology": choice.short, "topology_name": choice.name, "topology_why": choice.why}
    if not choice.data_parallel:
        return replace(tuned, result=tuned.result.model_copy(update=update))
    ev = tuned.evaluator
    answer, played = static_answer(ev, choice, tuned.result.winner, tuned.oracle, margin)
    if answer.k == 0:
        update.update(schedule=None, speculative_config=None)
    else:
        policy = static_policy(answer.k, ev.method, ev.model)
        assert isinstance(policy, FixedPolicy)
        update.update(schedule=[[1, ev.space.top, answer.k]], speculative_config=policy.to_vllm_speculative_config())
    update.update(static=answer, answer_reach=played[answer.k].max_batch)
    return replace(tuned, result=tuned.result.model_copy(update=update), played=played[answer.k], off=played[0])
