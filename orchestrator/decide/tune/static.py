"""`specdrill tune`'s answer for a data-parallel topology: the best STATIC k.

A vLLM DP group ignores `num_speculative_tokens_per_batch_size` and runs `num_speculative_tokens` in every step,
so what there is to choose is that one k. Each k in 0..max_k is played on the DP group itself (the campaign's
traffic, round-robin over its ranks, in virtual time) and scored as every tune candidate is (scoring: per
offered-rate band against `off` on the same engines, paired per seed; the tie rule: the fixed-batch oracle's k
over the batch sizes the traffic reached, then the smaller k). The schedule tune found for the same number of
engines as replicas (where vLLM keeps it) is then held against that k band by band: where it is faster beyond
the margin, the answer says by how much and that keeping it means N replicas behind a router instead of DP.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.analysis.steps.prediction_check import SeedRange
from orchestrator.decide.oracle import Oracle
from orchestrator.decide.played import AnyPolicy, Played
from orchestrator.decide.scoring import Scored, cells, compare, score, winner
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
    played = {k: traffic.play(static_policy(k, ev.method, ev.model)) for k in range(space.max_k + 1)}
    scored: list[Scored] = []
    for k, run in played.items():
        table = (k,) * len(space.edges)
        tie = (space.prior(table), 0 if k == 0 else 1, space.k_mass(table))
        band_cells = cells(run, played[0], ev.bands, ev.objective)
        scored.append(score(str(k), tie, band_cells, ev.scored_bands))
    k = int(winner(scored, ev.scored_bands, margin).key)
    figures = []
    if schedule_key != OFF:
        mine = cells(ev.played[schedule_key], played[0], ev.bands, ev.objective)
        ratios = seed_ratios(played[k], ev.played[schedule_key], ev.bands, ev.objective.latency)
        static = scored[k].cells
        figures = [
            BandFigure(band=band.label, speedup=SeedRange.of(ratios[b]),
                       verdict=compare(mine[b], static[b], margin) if b in ev.scored_bands else 0)
            for b, band in enumerate(ev.bands.bands)
        ]  # fmt: skip
    speedups = {j: [SeedRange.of(r) for r in seed_ratios(played[0], run, ev.bands)] for j, run in played.items()}
    answer = StaticAnswer(
        k=k, topology=choice.short, schedule_topology=f"replicas:{choice.topology.size}", speedups=speedups,
        figures=figures, beyond_reach=beyond_reach(truth, k, played[k].max_batch, margin),
    )  # fmt: skip
    return answer, played


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
