"""`specdrill tune CAMPAIGN.yaml`: the vLLM schedule (k per batch range) that serves the campaign's own traffic
best, searched in virtual time, so the batch sizes a schedule is judged at are the ones it causes.

The space: one k in 0..max_k per segment between candidate edges (oracle.DEFAULT_BATCH_SIZES and the batch sizes
where the dense oracle's best k changes, up to the largest batch the traffic reaches); above that batch, nothing
the traffic can show, the oracle's k is kept (its schedule without the k changes its own tolerance cannot tell
apart: tune_simplify). The search starts from that schedule snapped to the edges and climbs to the neighbour
with the smallest loss (one edge's k set to any other in 0..max_k, a whole segment's k +/- 1, a boundary moved
to the next edge) while it improves; then evaluates a coarse grid (every k on a few log-spaced segments) and
climbs again from the best candidate so far; then walks to the candidates that would win the tie (scoring's tie
rule: the oracle's k, then fewer k changes, then the smaller k), a neighbour or the schedule with one segment
merged into the next, while one of them wins it; then `simplify` removes every k change whose removal neither
the traffic nor the oracle can tell.
Every candidate is simulated on every unit of the traffic; the budget bounds their number, and a search it
stops says so (`stopped_by_budget`). On a space small enough `exhaustive` evaluates all of it for the same rule.
The search plays one topology's engines (prepare's `topology`: one engine, or N replicas); a data-parallel group
runs no schedule, and its answer is tune_static's.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from loadshapes.mixes import Workload, builtin_workload
from orchestrator.analysis.opmap.bands import BandSet, auto_rate_bands, rate_bands_from_edges
from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.decide.oracle import DEFAULT_BATCH_SIZES, DENSE_BATCH_SIZES, Oracle, oracle
from orchestrator.decide.played import AnyPolicy, CampaignTraffic, Played
from orchestrator.decide.scoring import Objective, Scored, best_by_loss, cells, score, winner
from orchestrator.decide.tune.progress import TuneProgress, silent
from orchestrator.decide.tune.simplify import no_predicted_gain, simplest_oracle_schedule
from orchestrator.decide.tune.space import KTable, Space, key_of, table_of
from orchestrator.decide.tune.topology import StaticAnswer, TopologyTraffic, with_single_off
from orchestrator.plan.campaign import Campaign
from serve_apps.policies import DynamicPolicy, FixedPolicy, OffPolicy, Topology, dense_schedule
from serve_apps.sim.profile import Profile

OFF = "off"
@dataclass
class Evaluator:
    """Plays candidates through the traffic and scores them; every evaluation is kept."""

    traffic: CampaignTraffic
    space: Space
    bands: BandSet
    objective: Objective
    scored_bands: list[int]
    method: str
    model: str | None
    budget: int = 600  # candidates to evaluate at most (off included)
    evaluated: dict[str, Scored] = field(default_factory=dict)
    played: dict[str, Played] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the search path
    stopped_by_budget: bool = False  # the search wanted a candidate the budget did not afford
    progress: TuneProgress = field(default_factory=silent)  # what tune says while it plays candidates (stderr)

    def policy_of(self, key: str) -> AnyPolicy:
        if key == OFF:
            return OffPolicy()
        return self.space.policy(tuple(int(k) for k in key.split(",")), self.method, self.model)

    def evaluate(self, key: str) -> Scored:
        if key not in self.evaluated:
            played = self.played.get(key) or self.traffic.play(self.policy_of(key))
            table = (0,) * len(self.space.edges) if key == OFF else table_of(key)
            # Speculation off has no schedule at all: simpler than any, 0 segments.
            tie = (self.space.prior(table), 0, 0) if key == OFF else self.space.tie(table)
            band_cells = cells(played, self.played[OFF], self.bands, self.objective)
            self.evaluated[key] = score(key, tie, band_cells, self.scored_bands)
            self.played[key] = played
            self.order.append(key)
            self.progress.step(f"searching schedules on {self.traffic_label}: candidates played (budget "
                               f"{self.budget})", len(self.evaluated))  # fmt: skip
        return self.evaluated[key]

    @property
    def traffic_label(self) -> str:
        topology = getattr(self.traffic, "topology", None)
        return "one engine" if topology is None or topology.kind == "single" else f"{topology.kind}:{topology.size}"

    def pick(self, margin: float) -> Scored:
        return winner(list(self.evaluated.values()), self.scored_bands, margin)

    def choice(self, candidate: Scored) -> Choice:
        schedule = None if candidate.key == OFF else self.space.entries(table_of(candidate.key))
        return Choice(key=candidate.key, schedule=schedule, tie=candidate.tie)

    def affordable(self, tables: Sequence[KTable]) -> list[KTable]:
        """The first of `tables` the budget still affords; fewer than asked: the search is stopped by it."""
        left = max(0, self.budget - len(self.evaluated))
        if len(tables) > left:
            self.stopped_by_budget = True
        return list(tables[:left])


COARSE_CANDIDATES = 125  # the coarse grid's size at most: (max_k + 1) ** edges


def coarse_edges(space: Space) -> tuple[int, ...]:
    """A few of the space's edges, log-spaced from 1 to the reach (as many as COARSE_CANDIDATES affords, fewer
    than the space has): the coarse grid's segment starts."""
    count = 1
    while (space.max_k + 1) ** (count + 1) <= COARSE_CANDIDATES and count + 1 < len(space.edges):
        count += 1
    chosen = {1}
    for i in range(1, count):
        target = space.reach ** (i / count)
        chosen.add(min(space.edges[1:], key=lambda e: (abs(math.log(e / target)), e)))
    return tuple(sorted(chosen))


def coarse_tables(space: Space) -> list[KTable]:
    """Every k in 0..max_k on each coarse segment, as tables of the full space."""
    edges = coarse_edges(space)
    segment = [max(i for i, start in enumerate(edges) if start <= edge) for edge in space.edges]
    return [tuple(ks[s] for s in segment) for ks in itertools.product(range(space.max_k + 1), repeat=len(edges))]


def climb(ev: Evaluator, start: KTable) -> Scored | None:
    """To the neighbour with the smallest loss while it improves; None when the budget affords not even the start."""
    if key_of(start) not in ev.evaluated and not ev.affordable([start]):
        return None
    current = ev.evaluate(key_of(start))
    while True:
        tables = ev.affordable([t for t in ev.space.neighbours(table_of(current.key)) if key_of(t) not in ev.evaluated])
        if not tables:
            break
        found = [ev.evaluate(key_of(t)) for t in tables]
        better = [c for c in found if not c.rejected and c.loss < current.loss]
        if not better:
            break
        current = min(better, key=lambda c: c.by_loss)
    return current


def local_search(ev: Evaluator, start: KTable, margin: float) -> Scored:
    """Two starts: the oracle's schedule, and the best of a coarse grid (a few segments, every k). From the
    oracle's start alone the climb stopped where several edges had to change together (costly-verify, a 120 s
    ramp to 36 req/s: k = 3 at batch 3 and k = 1 at 16-19 and 40-57 each alone no better), 2.2% slower in the
    quietest band than the coarse grid's best."""
    ev.evaluate(OFF)
    climb(ev, start)
    coarse = ev.affordable([t for t in coarse_tables(ev.space) if key_of(t) not in ev.evaluated])
    for table in coarse:
        ev.evaluate(key_of(table))
    usable = [c for c in ev.evaluated.values() if not c.rejected and c.key != OFF]
    if usable:
        climb(ev, table_of(min(usable, key=lambda c: c.by_loss).key))
    return tie_walk(ev, margin)


def tie_walk(ev: Evaluator, margin: float) -> Scored:
    """From the winner so far, every candidate that would win the tie (a neighbour or one segment merged into the
    next: closer to the oracle, or as close with fewer k changes, or as simple with smaller k), those first,
    while one of them becomes the winner."""
    pick = ev.pick(margin)
    while pick.key != OFF:
        space, table = ev.space, table_of(pick.key)
        wanted = {t for t in (*space.neighbours(table), *space.simpler(table)) if space.tie(t) < pick.tie}
        fresh = sorted((t for t in wanted if key_of(t) not in ev.evaluated), key=lambda t: (space.tie(t), t))
        tables = ev.affordable(fresh)
        if not tables:
            break
        for t in tables:
            ev.evaluate(key_of(t))
        following = ev.pick(margin)
        if following.key == pick.key:
            break
        pick = following
    return pick


def simplify(ev: Evaluator, pick: Scored, margin: float) -> Scored:
    """Never a k change whose predicted gain is within the margin (the simpler schedule wins, as the README
    says): while a schedule with one segment merged into its neighbour (Space.simpler; a schedule with one k on
    every batch the traffic reached: speculation off as well) is predicted no slower than the schedule itself
    beyond the margin in any band (tune_simplify.no_predicted_gain), the first such merge in the tie rule's order
    replaces it. The oracle's prior orders the merges; it vetoes none: an operator on a campaign of two engines
    at ~12 req/s was given [[1,15,4],[16,59,3],[60,512,2]] where its predicted gains over fixed k = 3 were 1.9,
    0.7 and 0.3% per band against a 2% margin, the oracle's 3% at batch 1 keeping k = 4 there. Compared with the
    schedule it simplifies, not with the best-loss candidate: the quickstart's tie winner set k = 2 at batch 16-22
    where fixed k = 3 predicted the same in every band, but the best-loss candidate (k = 0 there) ran 2.3% faster
    than fixed 3 on two seeds of one band, and a tie with it would have kept the change."""
    current = pick
    while current.key != OFF:
        table = table_of(current.key)
        merges = [key_of(t) for t in ev.space.simpler(table)]
        if len(set(table)) == 1:
            merges.append(OFF)
        for key in ev.affordable([table_of(k) for k in merges if k != OFF and k not in ev.evaluated]):
            ev.evaluate(key_of(key))
        tied = [ev.evaluated[k] for k in merges if k in ev.evaluated]
        tied = [c for c in tied if not c.rejected and no_predicted_gain(current, c, ev.scored_bands, margin)]
        if not tied:
            break
        current = min(tied, key=lambda c: (*c.tie, c.loss, c.key))
    return current


def exhaustive(ev: Evaluator, margin: float) -> Scored:
    """Every table of the space, whatever the budget."""
    ev.evaluate(OFF)
    for table in ev.space.all_tables():
        ev.evaluate(key_of(table))
    return ev.pick(margin)


# --- the campaign's side ------------------------------------------------------------------------------------


def drafter_of(campaign: Campaign, profile: Profile) -> tuple[str, str | None, int]:
    """The drafter (method, model) of the campaign's speculative arms (any topology) and its largest k: the k
    limit."""
    arms = [a for a in campaign.arms() if a.policy.kind != "off"]
    policies = [a.policy for a in arms if isinstance(a.policy, FixedPolicy | DynamicPolicy)]
    if not policies:
        return profile.drafter_method, profile.drafter_model, 4
    limits = [p.k if isinstance(p, FixedPolicy) else p.max_k for p in policies]
    return policies[0].method, policies[0].model, max(limits)


def oracle_workload(campaign: Campaign) -> Workload:
    """The mix's heaviest workload (a dataset mix: the built-in chat)."""
    if not campaign.mix.entries:
        return builtin_workload("chat")
    return max(campaign.mix.entries, key=lambda e: e.weight).resolved()


class Choice(BaseModel):
    """One candidate of the search, as a schedule (None: speculation off) with its tie measures."""

    model_config = ConfigDict(frozen=True)
    key: str
    schedule: list[list[int]] | None
    tie: tuple[float, int, int]  # scoring.Scored.tie: (the oracle's prior, segments, k mass)


class TuneResult(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    schedule: list[list[int]] | None  # None: speculation off is best
    speculative_config: dict[str, object] | None
    start_schedule: list[list[int]]  # the oracle's, its k changes within its own tolerance removed
    oracle_schedule: list[list[int]]  # the oracle's best k per measured batch size, as it is
    reach: int
    edges: list[int]
    candidates: int
    budget: int
    stopped_by_budget: bool  # the budget ended the search before it converged: best found so far, not tuned
    seconds: float
    bands: BandSet
    scored_bands: list[int]
    noisy_bands: list[str]  # not scored: the start schedule's cells there are noisy over seeds
    path: list[str]  # every candidate key in the order simulated
    start: str  # the start's key (the oracle's schedule snapped to the edges)
    winner: str  # the schedule given: the tie winner with its k changes of no predicted effect removed
    best_by_loss: Choice  # the candidate with the smallest loss
    tie_winner: Choice  # the tie rule's choice among the candidates tied with best_by_loss
    final: Choice  # the winner
    # The topology answered for (campaign short form) and, on a data-parallel one, the static k answer: then
    # `schedule` / `speculative_config` are that k's, and the search above is the schedule on as many replicas.
    topology: str = "single"
    topology_name: str = "single"
    topology_why: str = ""  # why this topology: "--topology", or which of the campaign's arms run on it
    answer_reach: int = 0  # the largest batch one engine ran under the answer itself (`reach`: under off, larger)
    static: StaticAnswer | None = None


@dataclass
class Tuned:
    result: TuneResult
    evaluator: Evaluator
    oracle: Oracle
    played: Played  # the answer played through the traffic on its topology
    off: Played  # speculation off on the same engines


def prepare(
    campaign: Campaign, profile: Profile, *, objective: Objective, seeds: int, max_k: int | None = None,
    edges: Sequence[int] | None = None, oracle_fn: Callable[..., Oracle] = oracle, budget: int = 600,
    topology: Topology | None = None, progress: TuneProgress | None = None,
) -> tuple[Evaluator, Oracle, list[list[int]]]:  # fmt: skip
    """The traffic on `topology`'s engines (default one), the oracle's start, the space and the bands, with `off`
    played: ready to search. The reach is the largest batch one engine ran."""
    traffic = TopologyTraffic.on(CampaignTraffic.of(with_single_off(campaign), seeds=seeds), topology or Topology())
    method, model, limit = drafter_of(traffic.campaign, profile)
    max_k = limit if max_k is None else max_k
    said = progress or silent()
    said.stage(f"playing speculation off ({seeds} seeds of the campaign's traffic)")
    off = traffic.play(OffPolicy())
    # The report's bands: the campaign's own edges where it sets them, else automatic ones on the same rates.
    edges_set = traffic.campaign.analysis.rate_bands
    bands = rate_bands_from_edges(edges_set) if edges_set else auto_rate_bands(off.offered_rate)
    top = profile.limits.max_num_seqs
    sizes = [b for b in DENSE_BATCH_SIZES if b <= top]
    building = f"building the fixed-batch oracle (closed batches of k 0-{max_k}): batch sizes"
    said.stage(f"building the fixed-batch oracle ({len(sizes)} batch sizes up to {sizes[-1]}, k 0-{max_k})")
    truth = oracle_fn(profile, workload=oracle_workload(traffic.campaign), max_k=max_k, batch_sizes=sizes,
                      tolerance=MapSettings().margin,
                      progress=lambda done, total: said.step(building, done, total))  # fmt: skip
    start_schedule = simplest_oracle_schedule(truth)
    if start_schedule[-1][1] < top:
        start_schedule[-1][1] = top
    reach = max(1, min(off.max_batch, top))
    regret = []
    for batch in range(1, reach + 1):
        speedup = truth.speedups_at(batch)
        best = max(speedup.values())
        regret.append(tuple(0.0 if s * (1 + truth.tolerance) >= best else best - s for s in speedup.values()))
    # Edges: the default batch sizes and every one where the oracle's best k changes, so that the start is the
    # oracle's schedule itself (the dense oracle's every size as an edge would triple the candidates per step).
    if edges is None:
        edges = [*DEFAULT_BATCH_SIZES, *(entry[0] for entry in truth.schedule())]
    chosen = sorted({1, *(e for e in edges if 1 <= e <= reach)})
    start_dense = dense_schedule(tuple((e[0], e[1], e[2]) for e in start_schedule), top, max_k)
    tail = tuple(int(start_dense[min(b, len(start_dense) - 1)]) for b in range(reach + 1, top + 1))
    space = Space(edges=tuple(chosen), reach=reach, top=top, tail=tail, max_k=max_k, regret=tuple(regret))
    ev = Evaluator(traffic=traffic, space=space, bands=bands, objective=objective, scored_bands=[], method=method,
                   model=model, budget=budget, progress=said)  # fmt: skip
    ev.played[OFF] = off
    return ev, truth, start_schedule


def tune(
    campaign: Campaign, profile: Profile, *, objective: Objective | None = None, seeds: int = 3,
    max_k: int | None = None, budget: int = 600, margin: float = MapSettings().margin,
    edges: Sequence[int] | None = None, search: Callable[..., Scored] | None = None, topology: Topology | None = None,
    progress: TuneProgress | None = None,
) -> Tuned:  # fmt: skip
    """The schedule search on `topology`'s engines (default one engine; a schedule: not data-parallel)."""
    if budget < 2:
        raise ValueError(f"--budget {budget}: at least 2 candidates (speculation off and the oracle's schedule)")
    began = time.perf_counter()
    objective = objective or Objective()
    said = progress or silent()
    ev, truth, start_schedule = prepare(campaign, profile, objective=objective, seeds=seeds, max_k=max_k,
                                        edges=edges, budget=budget, topology=topology, progress=said)  # fmt: skip
    said.stage(f"searching schedules on {ev.traffic_label} ({len(ev.space.edges)} edges up to batch "
               f"{ev.space.reach}, k 0-{ev.space.max_k}, budget {budget} candidates)")  # fmt: skip
    start = ev.space.snap(start_schedule)
    # Bands where the start's own cells are noisy over seeds are not scored, for any candidate: comparing
    # candidates there would be comparing noise (#49163 rejects such cells).
    ev.played[key_of(start)] = ev.traffic.play(ev.policy_of(key_of(start)))
    first = cells(ev.played[key_of(start)], ev.played[OFF], ev.bands, objective)
    ev.scored_bands = [b for b, c in enumerate(first) if not c.noisy]
    noisy = [ev.bands.bands[b].label for b, c in enumerate(first) if c.noisy]
    tied = local_search(ev, start, margin) if search is None else search(ev, margin)
    pick = simplify(ev, tied, margin)
    best = best_by_loss(list(ev.evaluated.values()))
    schedule = None if pick.key == OFF else ev.space.entries(table_of(pick.key))
    config = None
    if schedule is not None:
        policy = ev.space.policy(table_of(pick.key), ev.method, ev.model)
        config = policy.to_vllm_speculative_config()
    result = TuneResult(
        schedule=schedule, speculative_config=config, start_schedule=start_schedule,
        oracle_schedule=truth.schedule(), reach=ev.space.reach, edges=list(ev.space.edges),
        candidates=len(ev.evaluated), budget=budget, stopped_by_budget=ev.stopped_by_budget,
        seconds=time.perf_counter() - began, bands=ev.bands, scored_bands=ev.scored_bands, noisy_bands=noisy,
        path=list(ev.order), start=key_of(start), winner=pick.key, best_by_loss=ev.choice(best),
        tie_winner=ev.choice(tied), final=ev.choice(pick), answer_reach=ev.played[pick.key].max_batch,
    )  # fmt: skip
    return Tuned(result=result, evaluator=ev, oracle=truth, played=ev.played[pick.key], off=ev.played[OFF])
