"""The adaptive crossover search (`specdrill search`): where an arm stops helping against `off`, bracketed by short
paired units at constant offered rates instead of a fixed grid. Pure: the points measured so far go in, the next
step (or the outcome) comes out; orchestrator/search/run.py runs the units and measures each rate.

The crossover is where the deciding ratio (the analysis' own: per-token speedup, or goodput where that decided
the verdict; > 1 favours the arm) crosses 1. Two kinds of evidence, kept apart:

- *Steering* may follow a point estimate. The search measures a low and a high rate, widens (x `widen`) until
  the ratio leans below 1 somewhere above a rate where it leans above, then narrows that bracket on the
  measured ratios' PCHIP interpolant (monotone between points, so its root stays inside the bracket; vLLM's
  `bench sweep serve_sla` interpolates its SLA margin the same way).
- *Conclusions* rest only on intervals across traffic samples. Each unit at a rate is one traffic sample (its
  own arrivals and requests); one unit's bootstrap interval says how precisely that sample was measured, not how
  far another sample of the same rate lands (on the README's `first.yaml` two units at 5.57 req/s measured 0.993
  and ~1.19, each +-2.5%). A rate's interval is Student's t on its units' log ratios (`across_samples`): the
  spread between samples measured, never assumed, so a rate with one unit has none. A rate decides only where
  that interval excludes 1 and its units do not disagree. A crossover is a bracket whose two ends decide (above 1
  at the low end, below at the high end), each across at least two samples; rates in between are undecided. The
  settling phase gives the undecided rates at the bracket's edges more units (up to `max_units_per_rate`) and
  measures new rates just outside them until the bracket's ends decide, so the final bracket is the zone where
  the ratio is indistinguishable from 1 across samples, widened by the tolerance. A rate without an interval is
  insufficient, never evidence: "helps at every rate up to X" needs every rate measured up to X above 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy.interpolate import PchipInterpolator

from orchestrator.search.point import WORDS, SearchPoint, rate_text, rates_text

OutcomeKind = Literal[
    "crossover", "crossover_wide", "budget", "helps_everywhere", "never_helps", "undecided", "no_data", "host_lagged"
]
EPS = 1e-9


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SearchConfig(_Model):
    low: float = Field(gt=0)  # the first two rates measured, req/s
    high: float = Field(gt=0)
    min_rate: float = Field(gt=0)  # widening stops here: below it "never helps" is the answer
    max_rate: float = Field(gt=0)  # and above it "helps at every rate"
    widen: float = Field(default=2.0, gt=1)
    tolerance: float = Field(default=0.10, gt=0)  # the bracket's width, hi / lo - 1, that ends the search
    unit_requests: int = Field(default=150, ge=20)  # expected requests per arm in one unit
    # Traffic samples (units) at one rate at most. Near the crossover the spread between 150-request samples is
    # ~8% (first.yaml, 2026-12-06): a t interval on 5-6 of them decides ~15% from the crossing.
    max_units_per_rate: int = Field(default=6, ge=2)
    # The between-sample interval's, per look: a rate is looked at once per unit, up to max_units_per_rate - 1
    # times with an interval, so 99% per look keeps a wrong side at one rate under ~5% over all its looks
    # (Bonferroni). At 95% per look first.yaml's seed 9 took 3 samples at 6.31 req/s (0.914-0.937, the dense
    # sweep's ~1.006) as "does not help" and missed the sweep's crossover by 2% (benchmarks/bench_search_seeds.py).
    confidence: float = Field(default=0.99, gt=0, lt=1)
    budget_requests: int | None = Field(default=None, ge=1)  # requests to both arms together, all units
    # Real time: a unit whose simulated engine lagged behind its model (load.engine_lag_bound) measured the
    # host, not the arms; it is not counted and the step runs again, at most this many times in a search.
    max_lagged_units: int = Field(default=2, ge=0)
    # Requests already spent on units that were not counted (real time: the engine lagged); they come out of the
    # budget, and the budget's words still name the operator's own figure.
    not_counted_requests: int = Field(default=0, ge=0)
    max_rates: int = Field(default=40, ge=2)  # distinct rates at most: a bound on a search that cannot settle

    @model_validator(mode="after")
    def _ordered(self) -> SearchConfig:
        if not self.low < self.high:
            raise ValueError(f"the low rate ({self.low:g}) must be below the high one ({self.high:g})")
        if self.min_rate > self.low or self.max_rate < self.high:
            raise ValueError(
                f"rates {self.low:g}-{self.high:g} req/s must lie within the limits {self.min_rate:g}-{self.max_rate:g}"
            )
        return self

    @property
    def unit_cost(self) -> int:
        return 2 * self.unit_requests


class Step(_Model):
    """Measure `rate` (`extend`: another unit at a rate already measured), for the reason `why`."""

    rate: float
    extend: bool
    why: str


class Outcome(_Model):
    kind: OutcomeKind
    lo: float | None  # the bracket: the arm helps at lo, not at hi (each by its interval)
    hi: float | None
    estimate: float | None  # the PCHIP root inside the bracket
    message: str

    @property
    def width(self) -> float | None:
        return None if self.lo is None or self.hi is None else self.hi / self.lo - 1


def judged(points: Sequence[SearchPoint]) -> list[SearchPoint]:
    """The points with a side to steer by, by rate."""
    return sorted((p for p in points if p.helps is not None), key=lambda p: p.rate)


def bracket(points: Sequence[SearchPoint]) -> tuple[SearchPoint, SearchPoint] | None:
    """The steering bracket, the first crossing going up by `helps`: the lowest rate where the arm leans below 1,
    and the rate below it (leaning above); None when it leans above everywhere measured or below at the lowest."""
    ordered = judged(points)
    for i, point in enumerate(ordered):
        if not point.helps:
            return (ordered[i - 1], point) if i > 0 else None
    return None


def decided_bracket(points: Sequence[SearchPoint]) -> tuple[SearchPoint | None, SearchPoint | None]:
    """The evidence's bracket: the lowest rate whose interval is below 1 (H), and the highest below it whose
    interval is above 1 (L); either None where no rate decides so."""
    ordered = sorted(points, key=lambda p: p.rate)
    high = next((p for p in ordered if p.side == "below"), None)
    below_high = [p for p in ordered if high is None or p.rate < high.rate]
    low = next((p for p in reversed(below_high) if p.side == "above"), None)
    return low, high


def crossing(points: Sequence[SearchPoint], lo: float, hi: float) -> float:
    """Where the PCHIP interpolant of the measured ratios crosses 1 between lo and hi (their first root there);
    the geometric mean of lo and hi where it has none (a ratio without interval at an end)."""
    ordered = [p for p in judged(points) if p.ratio is not None]
    rates = np.array([p.rate for p in ordered])
    values = np.array([p.ratio for p in ordered], dtype=np.float64) - 1.0
    if len(rates) >= 2:
        roots = PchipInterpolator(rates, values).roots(extrapolate=False)
        inside = sorted(float(r) for r in roots if lo <= r <= hi)
        if inside:
            return inside[0]
    return math.sqrt(lo * hi)


def grid_crossover(points: Sequence[SearchPoint]) -> float | None:
    """A fixed grid's crossover by the search's steering rule (the benchmark's comparison of like with like):
    the first crossing of 1 on the PCHIP of its ratios. Not a reference for tests of the search."""
    found = bracket(points)
    return None if found is None else crossing(points, found[0].rate, found[1].rate)


def spent(points: Sequence[SearchPoint]) -> int:
    return sum(p.requests for p in points)


def _narrow(points: Sequence[SearchPoint], lo: float, hi: float, tolerance: float) -> Step:
    """While the bracket is wider than two tolerances, the estimated root itself (it splits the bracket where the
    crossing most likely is); then a rate beside it, on the side of the bracket end furthest from it, so that the
    next unit moves that end to within sqrt(1 + tolerance) of the root and the bracket closes in one or two more
    units when the estimate is good (and shrinks anyway when it is not)."""
    estimate = crossing(points, lo, hi)
    # Kept off the ends, so a poor estimate still cuts the bracket by a tenth of its (log) width.
    span = math.log(hi / lo)
    estimate = min(max(estimate, lo * math.exp(0.1 * span)), hi * math.exp(-0.1 * span))
    if hi / lo > (1 + tolerance) ** 2:
        return Step(rate=estimate, extend=False, why=f"PCHIP crossing at {rate_text(estimate)} req/s: measure it")
    step = math.sqrt(1 + tolerance) ** 0.9  # a little inside, so two such points are within the tolerance
    below, above = estimate / step, estimate * step
    low_gap, high_gap = math.log(estimate / lo), math.log(hi / estimate)
    if low_gap >= high_gap and below > lo:
        rate, side = below, "below"
    elif above < hi:
        rate, side = above, "above"
    else:
        rate, side = below, "below"
    return Step(rate=rate, extend=False, why=f"PCHIP crossing at {rate_text(estimate)} req/s: measure just {side} it")


def _extend(point: SearchPoint, config: SearchConfig) -> Step | None:
    if point.side != "unsure" or point.units >= config.max_units_per_rate:
        return None
    what = {"no_interval": "no interval", "units_disagree": "its units disagree",
            "one_sample": "one traffic sample"}.get(point.standing, "its interval includes 1")  # fmt: skip
    return Step(rate=point.rate, extend=True, why=f"{what}: another unit at the same rate, fresh traffic")


def _settle(points: Sequence[SearchPoint], config: SearchConfig) -> Step | None:
    """Once steering is done: the evidence's bracket made to decide. The undecided rates at the edges of the zone
    between the decided ends (where an end is missing, the zone runs to the lowest or highest rate measured) get
    more units, outside in; then a new rate just outside them (within the decided ends), or beyond them (x
    `widen`, within the limits) where no rate decides on that side. None: nothing left to measure."""
    low, high = decided_bracket(points)
    zone = sorted((p for p in points if p.side == "unsure" and (low is None or p.rate > low.rate)
                   and (high is None or p.rate < high.rate)), key=lambda p: p.rate)  # fmt: skip
    # Without a zone and an end missing, every undecided rate stands in the way of "everywhere" or "never".
    unsure = [] if low is not None and high is not None else sorted((p for p in points if p.side == "unsure"),
                                                                     key=lambda p: p.rate)  # fmt: skip
    # The zone's two edges in turn (the one with fewer samples first), so both ends of the bracket advance.
    for point in sorted([zone[0], zone[-1]], key=lambda p: p.units) if zone else unsure:
        extended = _extend(point, config)
        if extended is not None:
            return extended
    gap = math.sqrt(1 + config.tolerance)
    if low is not None and high is not None:
        if zone and zone[0].rate / low.rate > 1 + config.tolerance + EPS:
            return Step(rate=zone[0].rate / gap, extend=False, why="undecided above it: measure just below")
        if zone and high.rate / zone[-1].rate > 1 + config.tolerance + EPS:
            return Step(rate=zone[-1].rate * gap, extend=False, why="undecided below it: measure just above")
        return None
    if low is None and zone:  # no rate decides above 1: widen down from the lowest rate measured
        bottom = min([*(p.rate for p in zone), *([high.rate] if high else [])])
        if bottom > config.min_rate * (1 + EPS):
            return Step(rate=max(bottom / config.widen, config.min_rate), extend=False,
                        why="no rate helps by its interval: widen down")  # fmt: skip
    if high is None and zone:
        top = max([*(p.rate for p in zone), *([low.rate] if low else [])])
        if top < config.max_rate * (1 - EPS):
            return Step(rate=min(top * config.widen, config.max_rate), extend=False,
                        why="no rate stops helping by its interval: widen up")  # fmt: skip
    return None


def next_step(points: Sequence[SearchPoint], config: SearchConfig, *, arm: str, against: str) -> Step | Outcome:
    """The next unit to run, or the outcome. `points` in the order they were first measured."""
    if not points:
        return _affordable(points, config, Step(rate=config.low, extend=False, why="the low end"), arm, against)
    if len(points) == 1:
        return _affordable(points, config, Step(rate=config.high, extend=False, why="the high end"), arm, against)
    if len(points) >= config.max_rates:
        return conclude(points, config, arm=arm, against=against, stopped=f"stopped after {len(points)} rates")
    step: Step | None = None
    found = bracket(points)
    if found is not None:
        lo, hi = found[0].rate, found[1].rate
        if hi / lo - 1 > config.tolerance + EPS:
            step = _narrow(points, lo, hi, config.tolerance)
    else:
        ordered = judged(points)
        if ordered and ordered[0].helps and ordered[-1].rate < config.max_rate * (1 - EPS):
            step = Step(rate=min(ordered[-1].rate * config.widen, config.max_rate), extend=False,
                        why="helps at every rate so far: widen up")  # fmt: skip
        elif ordered and not ordered[0].helps and ordered[0].rate > config.min_rate * (1 + EPS):
            step = Step(rate=max(ordered[0].rate / config.widen, config.min_rate), extend=False,
                        why="no help at the lowest rate: widen down")  # fmt: skip
    step = step or _settle(points, config)
    if step is not None:
        return _affordable(points, config, step, arm, against)
    return conclude(points, config, arm=arm, against=against)


def _affordable(points: Sequence[SearchPoint], config: SearchConfig, step: Step, arm: str,
                against: str) -> Step | Outcome:  # fmt: skip
    """The step, or the budget's outcome when its unit would not fit in what is left."""
    used_total = spent(points) + config.not_counted_requests
    if config.budget_requests is None or used_total + config.unit_cost <= config.budget_requests:
        return step
    used = f"{used_total} of {config.budget_requests} requests"
    if config.not_counted_requests:
        used += f", {config.not_counted_requests} of them in units not counted"
    return conclude(points, config, arm=arm, against=against, stopped=f"budget spent ({used})")


def evidence(points: Sequence[SearchPoint]) -> str:
    """Every rate measured, grouped by what its evidence says: each clause true on its own."""
    ordered = sorted(points, key=lambda p: p.rate)
    clauses = []
    for standing in ("above", "below", "includes_1", "units_disagree", "one_sample", "no_interval"):
        group = [p for p in ordered if p.standing == standing]
        if group:
            verdict, _, why = WORDS[standing].partition(" (")
            clauses.append(f"{verdict} at {rates_text(group)} req/s ({why}")
    return "; ".join(clauses) if clauses else "no rate measured"


def end_text(point: SearchPoint) -> str:
    """A bracket end with the samples it rests on: "5.2 req/s (1.120 [1.050, 1.190] across 4 samples)"."""
    return f"{rate_text(point.rate)} req/s ({point.ratio_text})"


def samples_text(points: Sequence[SearchPoint]) -> str:
    """How many traffic samples each rate rests on: "2 traffic samples each" or "2-4 traffic samples each"."""
    counts = sorted({len(p.samples) for p in points})
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{span} traffic sample{'s' if counts[-1] != 1 else ''} each"


def conclude(points: Sequence[SearchPoint], config: SearchConfig, *, arm: str, against: str,
             stopped: str | None = None) -> Outcome:  # fmt: skip
    """The outcome from the intervals alone. `stopped`: why the search ended early (the budget, the rate
    limit), said first; None: it ended because nothing was left to measure. A bracket's ends decide across
    samples (a rate with one has no interval), so every bracket it names is settled, and says on how many."""
    low, high = decided_bracket(points)
    ordered = sorted(points, key=lambda p: p.rate)
    prefix = f"{stopped}: " if stopped else ""
    if low is not None and high is not None:
        lo, hi = low.rate, high.rate
        estimate = crossing(points, lo, hi)
        width = hi / lo - 1
        between = [p for p in ordered if lo < p.rate < hi]
        ends = f"settled across traffic samples: helps at {end_text(low)}, not at {end_text(high)}"
        if stopped is None and width <= config.tolerance + EPS:
            return Outcome(
                kind="crossover", lo=lo, hi=hi, estimate=estimate,
                message=f"crossover between {rate_text(lo)} and {rate_text(hi)} req/s (bracket within "
                f"{config.tolerance:.0%}), {ends}: {arm} stops helping against {against} near "
                f"{rate_text(estimate)} req/s",
            )  # fmt: skip
        why = f"; between them {evidence(between)}" if between else ""
        # One decimal where whole percents would print the tolerance itself ("a bracket of 10%, not the 10% asked").
        width_text = f"{width:.0%}" if f"{width:.0%}" != f"{config.tolerance:.0%}" else f"{width:.1%}"
        return Outcome(
            kind="budget" if stopped else "crossover_wide", lo=lo, hi=hi, estimate=estimate,
            message=f"{prefix}crossover between {rate_text(lo)} and {rate_text(hi)} req/s, a bracket of {width_text}, "
            f"not the {config.tolerance:.0%} asked, {ends}{why}; {arm} stops helping against {against} in it "
            f"(PCHIP estimate {rate_text(estimate)} req/s)",
        )  # fmt: skip
    kind: OutcomeKind = "budget" if stopped else "undecided"
    if ordered and all(p.side == "above" for p in ordered):
        top = ordered[-1].rate
        if stopped is None:
            return Outcome(kind="helps_everywhere", lo=top, hi=None, estimate=None,
                           message=f"{arm} helps at every rate up to {rate_text(top)} req/s (against {against}; "
                           f"{samples_text(ordered)})")  # fmt: skip
        return Outcome(kind=kind, lo=top, hi=None, estimate=None,
                       message=f"{prefix}{arm} helps at every rate measured, up to {rate_text(top)} req/s, no "
                       f"crossover found (against {against}; {samples_text(ordered)})")  # fmt: skip
    if ordered and all(p.side == "below" for p in ordered):
        bottom = ordered[0].rate
        if stopped is None:
            return Outcome(kind="never_helps", lo=None, hi=bottom, estimate=None,
                           message=f"{arm} never helps down to {rate_text(bottom)} req/s (against {against}; "
                           f"{samples_text(ordered)})")  # fmt: skip
        return Outcome(kind=kind, lo=None, hi=bottom, estimate=None,
                       message=f"{prefix}{arm} helps at no rate measured, down to {rate_text(bottom)} req/s "
                       f"(against {against}; {samples_text(ordered)})")  # fmt: skip
    if not any(p.side != "unsure" for p in ordered) and stopped is None:
        kind = "no_data"
    return Outcome(kind=kind, lo=None, hi=None, estimate=None,
                   message=f"{prefix}no crossover established for {arm} against {against}: {evidence(ordered)}")


def path_line(n: int, point: SearchPoint, step: Step) -> str:
    """One step of the search path as the console prints it: one verdict, the search's."""
    samples = f"; samples {', '.join(f'{r:.3f}' for r in point.samples)}" if len(point.samples) > 1 else ""
    return (
        f"{n:>2}. {rate_text(point.rate):>6} req/s  ratio {point.ratio_text} on {point.measure}: "
        f"{WORDS[point.standing]} (units {point.units}, requests {point.requests}{samples}) <- {step.why}"
    )
