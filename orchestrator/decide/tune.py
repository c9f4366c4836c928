"""`specdrill tune CAMPAIGN.yaml`: the vLLM schedule (k per batch range) that serves the campaign's own traffic
best, searched in virtual time, so the batch sizes a schedule is judged at are the ones it causes.

The space: one k in 0..max_k per segment between candidate edges (oracle.DEFAULT_BATCH_SIZES and the batch sizes
where the dense oracle's best k changes, up to the largest batch the traffic reaches); above that batch, nothing
the traffic can show, the oracle's k is kept. The search starts from the fixed-batch oracle's schedule snapped
to the edges and climbs to the neighbour with the smallest loss (one edge's k set to any other in 0..max_k, a
whole segment's k +/- 1, a boundary moved to the next edge) while it improves; then evaluates a coarse grid
(every k on a few log-spaced segments) and climbs again from the best candidate so far; then walks to
neighbours that tie and win the tie (scoring.winner: closer to the oracle, then smaller k). Every candidate is
simulated on every unit of the traffic; on a space small enough `exhaustive` evaluates all of it for the same rule.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from loadshapes.mixes import Workload, builtin_workload
from orchestrator.analysis.bands import BandSet, auto_rate_bands
from orchestrator.analysis.results import MapSettings
from orchestrator.campaign import Campaign
from orchestrator.decide.oracle import DEFAULT_BATCH_SIZES, DENSE_BATCH_SIZES, Oracle, oracle
from orchestrator.decide.played import AnyPolicy, CampaignTraffic, Played, drafter_arms
from orchestrator.decide.scoring import Objective, Scored, cells, score, winner
from serve_apps.policies import DynamicPolicy, FixedPolicy, OffPolicy, ResolvedSpeculation, dense_schedule
from serve_apps.sim.profile import Profile

OFF = "off"
KTable = tuple[int, ...]  # one k per edge of the space


@dataclass(frozen=True)
class Space:
    edges: tuple[int, ...]  # segment starts, edges[0] == 1, all <= reach
    reach: int  # the largest batch the traffic reached
    top: int  # the engine's max_num_seqs: the schedule covers 1..top
    tail: tuple[int, ...]  # k at batch reach+1 .. top (dense): the oracle's, kept
    max_k: int
    # Per batch 1..reach (index batch - 1), per k: the oracle's speedup lost against its best k there, 0 within
    # its tolerance: what breaks ties before the smaller k does.
    regret: tuple[tuple[float, ...], ...]

    def entries(self, ks: KTable) -> list[list[int]]:
        """vLLM's num_speculative_tokens_per_batch_size ([start, end, k], inclusive) for these k."""
        dense = [0] * (self.top + 1)
        for i, start in enumerate(self.edges):
            end = self.edges[i + 1] - 1 if i + 1 < len(self.edges) else self.reach
            for b in range(start, end + 1):
                dense[b] = ks[i]
        for offset, k in enumerate(self.tail):
            dense[self.reach + 1 + offset] = k
        entries: list[list[int]] = []
        for b in range(1, self.top + 1):
            if entries and entries[-1][2] == dense[b]:
                entries[-1][1] = b
            else:
                entries.append([b, b, dense[b]])
        return entries

    def k_mass(self, ks: KTable) -> int:
        """Sum of k over batch sizes 1..reach: what ties are broken by (smaller k)."""
        total = 0
        for i, start in enumerate(self.edges):
            end = self.edges[i + 1] - 1 if i + 1 < len(self.edges) else self.reach
            total += ks[i] * (end - start + 1)
        return total

    def prior(self, ks: KTable) -> float:
        """The oracle's speedup lost over batch sizes 1..reach: where the traffic cannot tell candidates apart
        (a batch size it rarely runs moves no band beyond the margin), the fixed-batch oracle decides."""
        total = 0.0
        for i, start in enumerate(self.edges):
            end = self.edges[i + 1] - 1 if i + 1 < len(self.edges) else self.reach
            total += sum(self.regret[b - 1][ks[i]] for b in range(start, end + 1))
        return total

    def snap(self, schedule: Sequence[Sequence[int]]) -> KTable:
        """A schedule's k at each edge."""
        table = dense_schedule(tuple((e[0], e[1], e[2]) for e in schedule), self.top, self.max_k)
        return tuple(int(table[min(edge, len(table) - 1)]) for edge in self.edges)

    def neighbours(self, ks: KTable) -> list[KTable]:
        out: set[KTable] = set()
        n = len(ks)
        for i in range(n):  # one edge's k set to any other: +/- 1 alone stopped where k +/- 1 was worse and
            for k in range(self.max_k + 1):  # k +/- 2 better (batch 3 of the test ramp: 4 -> 3 worse, 4 -> 2 best)
                if k != ks[i]:
                    out.add((*ks[:i], k, *ks[i + 1 :]))
        for lo, hi in _runs(ks):  # a whole segment's k
            for step in (-1, 1):
                k = ks[lo] + step
                if 0 <= k <= self.max_k:
                    out.add(ks[:lo] + (k,) * (hi - lo) + ks[hi:])
        for i in range(1, n):  # a boundary moved by one edge either way
            if ks[i] != ks[i - 1]:
                out.add((*ks[:i], ks[i - 1], *ks[i + 1 :]))
                out.add((*ks[: i - 1], ks[i], *ks[i:]))
        out.discard(ks)
        return sorted(out)

    def all_tables(self) -> Iterable[KTable]:
        return itertools.product(range(self.max_k + 1), repeat=len(self.edges))

    def policy(self, ks: KTable, method: str, model: str | None) -> DynamicPolicy:
        entries = self.entries(ks)
        return DynamicPolicy.model_validate(
            {"method": method, "model": model, "max_k": max(1, max(e[2] for e in entries)), "schedule": entries}
        )


def _runs(ks: KTable) -> list[tuple[int, int]]:
    runs, start = [], 0
    for i in range(1, len(ks) + 1):
        if i == len(ks) or ks[i] != ks[start]:
            runs.append((start, i))
            start = i
    return runs


def key_of(ks: KTable) -> str:
    return ",".join(map(str, ks))


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
    evaluated: dict[str, Scored] = field(default_factory=dict)
    played: dict[str, Played] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the search path

    def policy_of(self, key: str) -> AnyPolicy:
        if key == OFF:
            return OffPolicy()
        return self.space.policy(tuple(int(k) for k in key.split(",")), self.method, self.model)

    def evaluate(self, key: str) -> Scored:
        if key not in self.evaluated:
            played = self.played.get(key) or self.traffic.play(self.policy_of(key))
            table = (0,) * len(self.space.edges) if key == OFF else _table(key)
            band_cells = cells(played, self.played[OFF], self.bands, self.objective)
            self.evaluated[key] = score(key, self.space.k_mass(table), self.space.prior(table), band_cells,
                                        self.scored_bands)  # fmt: skip
            self.played[key] = played
            self.order.append(key)
        return self.evaluated[key]

    def pick(self, margin: float) -> Scored:
        return winner(list(self.evaluated.values()), self.scored_bands, margin)


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


def climb(ev: Evaluator, start: KTable, budget: int) -> Scored:
    """To the neighbour with the smallest loss while it improves."""
    current = ev.evaluate(key_of(start))
    while len(ev.evaluated) < budget:
        tables = [t for t in ev.space.neighbours(_table(current.key)) if key_of(t) not in ev.evaluated]
        tables = tables[: max(0, budget - len(ev.evaluated))]
        found = [ev.evaluate(key_of(t)) for t in tables]
        better = [c for c in found if not c.rejected and c.loss < current.loss]
        if not better:
            break
        current = min(better, key=lambda c: c.by_loss)
    return current


def local_search(ev: Evaluator, start: KTable, margin: float, budget: int) -> Scored:
    """Two starts: the oracle's schedule, and the best of a coarse grid (a few segments, every k). From the
    oracle's start alone the climb stopped where several edges had to change together (costly-verify, a 120 s
    ramp to 36 req/s: k = 3 at batch 3 and k = 1 at 16-19 and 40-57 each alone no better), 2.2% slower in the
    quietest band than the coarse grid's best."""
    ev.evaluate(OFF)
    climb(ev, start, budget)
    for table in coarse_tables(ev.space):
        if len(ev.evaluated) >= budget:
            break
        ev.evaluate(key_of(table))
    usable = [c for c in ev.evaluated.values() if not c.rejected and c.key != OFF]
    if usable:
        climb(ev, _table(min(usable, key=lambda c: c.by_loss).key), budget)
    # The tie walk: from the winner so far, the neighbours that would win a tie (closer to the oracle, or as
    # close with smaller k), while one of them becomes the winner.
    pick = ev.pick(margin)
    while len(ev.evaluated) < budget and pick.key != OFF:
        space = ev.space
        smaller = [t for t in space.neighbours(_table(pick.key)) if (space.prior(t), space.k_mass(t)) < pick.tie]
        for t in smaller[: max(0, budget - len(ev.evaluated))]:
            ev.evaluate(key_of(t))
        following = ev.pick(margin)
        if following.key == pick.key:
            break
        pick = following
    return pick


def exhaustive(ev: Evaluator, margin: float) -> Scored:
    ev.evaluate(OFF)
    for table in ev.space.all_tables():
        ev.evaluate(key_of(table))
    return ev.pick(margin)


def _table(key: str) -> KTable:
    return tuple(int(k) for k in key.split(","))


# --- the campaign's side ------------------------------------------------------------------------------------


def drafter_of(campaign: Campaign, profile: Profile) -> tuple[str, str | None, int]:
    """The drafter (method, model) of the campaign's speculative arms and its largest k: the k limit."""
    arms = drafter_arms(campaign)
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


class TuneResult(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    schedule: list[list[int]] | None  # None: speculation off is best
    speculative_config: dict[str, object] | None
    start_schedule: list[list[int]]
    reach: int
    edges: list[int]
    candidates: int
    seconds: float
    bands: BandSet
    scored_bands: list[int]
    noisy_bands: list[str]  # not scored: the start schedule's cells there are noisy over seeds
    path: list[str]  # every candidate key in the order simulated
    winner: str


@dataclass
class Tuned:
    result: TuneResult
    evaluator: Evaluator
    oracle: Oracle


def prepare(
    campaign: Campaign, profile: Profile, *, objective: Objective, seeds: int, max_k: int | None = None,
    edges: Sequence[int] | None = None, oracle_fn: Callable[..., Oracle] = oracle,
) -> tuple[Evaluator, Oracle, list[list[int]]]:  # fmt: skip
    """The traffic, the oracle's start, the space and the bands, with `off` played: ready to search."""
    traffic = CampaignTraffic.of(campaign, seeds=seeds)
    method, model, limit = drafter_of(traffic.campaign, profile)
    max_k = limit if max_k is None else max_k
    off = traffic.play(OffPolicy())
    bands = auto_rate_bands(off.offered_rate)
    top = profile.limits.max_num_seqs
    sizes = [b for b in DENSE_BATCH_SIZES if b <= top]
    truth = oracle_fn(profile, workload=oracle_workload(traffic.campaign), max_k=max_k, batch_sizes=sizes,
                      tolerance=MapSettings().margin)  # fmt: skip
    start_schedule = truth.schedule()
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
        edges = [*DEFAULT_BATCH_SIZES, *(entry[0] for entry in start_schedule)]
    chosen = sorted({1, *(e for e in edges if 1 <= e <= reach)})
    start_dense = dense_schedule(tuple((e[0], e[1], e[2]) for e in start_schedule), top, max_k)
    tail = tuple(int(start_dense[min(b, len(start_dense) - 1)]) for b in range(reach + 1, top + 1))
    space = Space(edges=tuple(chosen), reach=reach, top=top, tail=tail, max_k=max_k, regret=tuple(regret))
    ev = Evaluator(traffic=traffic, space=space, bands=bands, objective=objective, scored_bands=[], method=method,
                   model=model)  # fmt: skip
    ev.played[OFF] = off
    return ev, truth, start_schedule


def tune(
    campaign: Campaign, profile: Profile, *, objective: Objective | None = None, seeds: int = 3,
    max_k: int | None = None, budget: int = 600, margin: float = MapSettings().margin,
    edges: Sequence[int] | None = None, search: Callable[..., Scored] | None = None,
) -> Tuned:  # fmt: skip
    began = time.perf_counter()
    objective = objective or Objective()
    ev, truth, start_schedule = prepare(campaign, profile, objective=objective, seeds=seeds, max_k=max_k,
                                        edges=edges)  # fmt: skip
    start = ev.space.snap(start_schedule)
    # Bands where the start's own cells are noisy over seeds are not scored, for any candidate: comparing
    # candidates there would be comparing noise (#49163 rejects such cells).
    ev.played[key_of(start)] = ev.traffic.play(ev.policy_of(key_of(start)))
    first = cells(ev.played[key_of(start)], ev.played[OFF], ev.bands, objective)
    ev.scored_bands = [b for b, c in enumerate(first) if not c.noisy]
    noisy = [ev.bands.bands[b].label for b, c in enumerate(first) if c.noisy]
    pick = local_search(ev, start, margin, budget) if search is None else search(ev, margin)
    schedule = None if pick.key == OFF else ev.space.entries(_table(pick.key))
    config = None
    if schedule is not None:
        policy = ev.space.policy(_table(pick.key), ev.method, ev.model)
        config = policy.to_vllm_speculative_config()
    result = TuneResult(
        schedule=schedule, speculative_config=config, start_schedule=start_schedule, reach=ev.space.reach,
        edges=list(ev.space.edges), candidates=len(ev.evaluated), seconds=time.perf_counter() - began,
        bands=ev.bands, scored_bands=ev.scored_bands, noisy_bands=noisy, path=list(ev.order), winner=pick.key,
    )  # fmt: skip
    return Tuned(result=result, evaluator=ev, oracle=truth)


def k_at(schedule: Sequence[Sequence[int]] | None, batch: int, top: int) -> int:
    if schedule is None:
        return 0
    max_k = max(e[2] for e in schedule)
    resolved = ResolvedSpeculation(method="x", num_speculative_tokens=max(1, max_k),
                                   schedule=tuple((e[0], e[1], e[2]) for e in schedule))  # fmt: skip
    return resolved.k_for_batch(min(batch, top), top)


def oracle_gap(truth: Oracle, schedule: Sequence[Sequence[int]] | None, top: int) -> list[tuple[int, int, int, float]]:
    """Per oracle batch size: (batch, schedule's k, oracle's best k, the best k's speedup over off minus the
    schedule's k's), speedups from the oracle's fixed-batch per-token latency."""
    rows = []
    for point in truth.points:
        k = k_at(schedule, point.batch_size, top)
        off = point.tpot_p50_s[0]
        best = off / point.tpot_p50_s[point.best_k]
        mine = off / point.tpot_p50_s[min(k, truth.max_k)]
        rows.append((point.batch_size, k, point.best_k, float(best - mine)))
    return rows
