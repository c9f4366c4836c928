"""The adaptive crossover search (`specdrill search`): where an arm stops helping against `off`, bracketed by short
paired units at constant offered rates instead of a fixed grid. Pure: the points measured so far go in, the next
step (or the outcome) comes out; orchestrator/search_run.py runs the units and measures each rate.

The crossover is where the deciding ratio (the analysis' own: per-token speedup, or goodput where that decided
the verdict; > 1 favours the arm) crosses 1. The search measures a low and a high rate, widens (x `widen`) until
the ratio falls below 1 somewhere above a rate where it is above 1, then narrows that bracket: the next rate is
placed on the measured ratios' PCHIP interpolant (monotone between points, so its root stays inside the
bracket; vLLM's `bench sweep serve_sla` interpolates its SLA margin the same way): at the estimated root while
the bracket is wide, then just beside it so that one or two more units close the bracket to `tolerance`. A
rate the answer rests on (a final bracket end, the last rate of "helps everywhere" or "never helps") whose
interval still includes 1 gets another unit of fresh requests (sequential intervals) up to
`max_units_per_rate`; elsewhere, and after that, the point estimate takes the side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy.interpolate import PchipInterpolator

Side = Literal["above", "below", "unsure"]
OutcomeKind = Literal["crossover", "budget", "helps_everywhere", "never_helps", "no_data", "host_lagged"]


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
    max_units_per_rate: int = Field(default=2, ge=1)
    budget_requests: int | None = Field(default=None, ge=1)  # requests to both arms together, all units
    # Real time: a unit whose simulated engine lagged behind its model (load.engine_lag_bound) measured the
    # host, not the arms; it is not counted and the step runs again, at most this many times in a search.
    max_lagged_units: int = Field(default=2, ge=0)

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


class SearchPoint(_Model):
    """One offered rate: every unit measured there, pooled (the same requests to both arms in each)."""

    rate: float
    ratio: float | None  # the deciding ratio, > 1 favours the arm
    low: float | None
    high: float | None
    measure: str  # "per-token latency" or "goodput": which ratio decided the verdict
    verdict: str  # the analysis' verdict (helps / no_difference / hurts / insufficient_data), margin included
    units: int
    requests: int  # sent to both arms together

    @property
    def ratio_text(self) -> str:
        """The ratio with its interval, as the console, the report and the benchmark print it."""
        if self.ratio is None:
            return "n/a"
        if self.low is None or self.high is None:
            return f"{self.ratio:.3f} (no interval)"
        return f"{self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}]"

    @property
    def side(self) -> Side:
        """Of 1, by the interval: above or below it, or unsure (it includes 1, or there is no interval)."""
        if self.low is not None and self.low > 1:
            return "above"
        if self.high is not None and self.high < 1:
            return "below"
        return "unsure"

    @property
    def helps(self) -> bool | None:
        """The side the search takes: the interval's, else the point estimate's; None without a ratio."""
        if self.side != "unsure":
            return self.side == "above"
        return None if self.ratio is None else self.ratio > 1


class Step(_Model):
    """Measure `rate` (`extend`: another unit at a rate already measured), for the reason `why`."""

    rate: float
    extend: bool
    why: str


class Outcome(_Model):
    kind: OutcomeKind
    lo: float | None  # the bracket: the arm helps at lo, not at hi
    hi: float | None
    estimate: float | None  # the PCHIP root inside the bracket
    message: str

    @property
    def width(self) -> float | None:
        return None if self.lo is None or self.hi is None else self.hi / self.lo - 1


def rate_text(rate: float) -> str:
    return f"{rate:.3g}"


def judged(points: Sequence[SearchPoint]) -> list[SearchPoint]:
    """The points with a side, by rate."""
    return sorted((p for p in points if p.helps is not None), key=lambda p: p.rate)


def bracket(points: Sequence[SearchPoint]) -> tuple[SearchPoint, SearchPoint] | None:
    """The first crossing going up: the lowest rate where the arm does not help, and the rate below it (where it
    does); None when it helps everywhere measured or already at the lowest rate."""
    ordered = judged(points)
    for i, point in enumerate(ordered):
        if not point.helps:
            return (ordered[i - 1], point) if i > 0 else None
    return None


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
    """A fixed grid's crossover by the same rule: the first crossing of 1 on the PCHIP of its ratios."""
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


def _confirm(points: Sequence[SearchPoint], config: SearchConfig, decisive: Sequence[SearchPoint]) -> Step | None:
    """Sequential intervals where they decide the answer: another unit at a rate the outcome rests on while its
    interval still includes 1 (up to max_units_per_rate); elsewhere the point estimate steers the search."""
    for point in decisive:
        if point.side == "unsure" and point.units < config.max_units_per_rate:
            what = "no interval" if point.low is None else "its interval includes 1"
            return Step(rate=point.rate, extend=True, why=f"{what}: another unit at the same rate")
    return None


def next_step(points: Sequence[SearchPoint], config: SearchConfig, *, arm: str, against: str) -> Step | Outcome:
    """The next unit to run, or the outcome. `points` in the order they were first measured."""
    if not points:
        return _affordable(points, config, Step(rate=config.low, extend=False, why="the low end"), arm)
    if len(points) == 1:
        return _affordable(points, config, Step(rate=config.high, extend=False, why="the high end"), arm)
    found = bracket(points)
    if found is not None:
        lo, hi = found[0].rate, found[1].rate
        if hi / lo - 1 <= config.tolerance + 1e-9:
            confirm = _confirm(points, config, found)
            if confirm is not None:
                return _affordable(points, config, confirm, arm)
            estimate = crossing(points, lo, hi)
            return Outcome(
                kind="crossover", lo=lo, hi=hi, estimate=estimate,
                message=f"crossover between {rate_text(lo)} and {rate_text(hi)} req/s (bracket within "
                f"{config.tolerance:.0%}): {arm} stops helping against {against} near {rate_text(estimate)} req/s",
            )  # fmt: skip
        return _affordable(points, config, _narrow(points, lo, hi, config.tolerance), arm)
    ordered = judged(points)
    if not ordered:
        return Outcome(
            kind="no_data",
            lo=None,
            hi=None,
            estimate=None,
            message=f"no verdict at any rate measured: too few requests for a ratio ({arm} vs {against})",
        )
    if ordered[0].helps:  # helps at every rate measured: widen up
        top = ordered[-1].rate
        if top >= config.max_rate * (1 - 1e-9):
            confirm = _confirm(points, config, ordered[-1:])
            if confirm is not None:
                return _affordable(points, config, confirm, arm)
            return Outcome(
                kind="helps_everywhere",
                lo=top,
                hi=None,
                estimate=None,
                message=f"{arm} helps at every rate up to {rate_text(top)} req/s (against {against})",
            )
        rate = min(top * config.widen, config.max_rate)
        return _affordable(points, config, Step(rate=rate, extend=False, why="helps at every rate so far: widen up"),
                           arm)  # fmt: skip
    bottom = ordered[0].rate
    if bottom <= config.min_rate * (1 + 1e-9):
        confirm = _confirm(points, config, ordered[:1])
        if confirm is not None:
            return _affordable(points, config, confirm, arm)
        return Outcome(kind="never_helps", lo=None, hi=bottom, estimate=None,
                       message=f"{arm} never helps down to {rate_text(bottom)} req/s (against {against})")  # fmt: skip
    rate = max(bottom / config.widen, config.min_rate)
    return _affordable(points, config, Step(rate=rate, extend=False, why="no help at the lowest rate: widen down"), arm)


def _affordable(points: Sequence[SearchPoint], config: SearchConfig, step: Step, arm: str) -> Step | Outcome:
    """The step, or the budget's outcome when its unit would not fit in what is left."""
    if config.budget_requests is None or spent(points) + config.unit_cost <= config.budget_requests:
        return step
    return budget_outcome(points, config, arm)


def budget_outcome(points: Sequence[SearchPoint], config: SearchConfig, arm: str) -> Outcome:
    used = f"{spent(points)} of {config.budget_requests} requests"
    found = bracket(points)
    if found is not None:
        lo, hi = found[0].rate, found[1].rate
        return Outcome(
            kind="budget", lo=lo, hi=hi, estimate=crossing(points, lo, hi),
            message=f"budget spent: bracket {rate_text(lo)}-{rate_text(hi)} req/s ({hi / lo - 1:.0%}; {used})",
        )  # fmt: skip
    ordered = judged(points)
    if not ordered:
        said = "no rate measured" if not points else "no verdict at any rate measured"
        return Outcome(kind="budget", lo=None, hi=None, estimate=None, message=f"budget spent: {said} ({used})")
    if ordered[0].helps:
        return Outcome(
            kind="budget", lo=ordered[-1].rate, hi=None, estimate=None,
            message=f"budget spent before a bracket: {arm} helps at every rate measured, up to "
            f"{rate_text(ordered[-1].rate)} req/s ({used})",
        )  # fmt: skip
    return Outcome(
        kind="budget", lo=None, hi=ordered[0].rate, estimate=None,
        message=f"budget spent before a bracket: {arm} helps at no rate measured, down to "
        f"{rate_text(ordered[0].rate)} req/s ({used})",
    )  # fmt: skip


def path_line(n: int, point: SearchPoint, step: Step) -> str:
    """One step of the search path as the console prints it."""
    ratio = f"ratio {point.ratio_text}"
    decision = {"above": "helps (interval above 1)", "below": "stops helping (interval below 1)"}.get(point.side)
    if decision is None:
        lean = point.helps
        decision = "undecided" if lean is None else f"interval includes 1, point {'above' if lean else 'below'} 1"
    return (
        f"{n:>2}. {rate_text(point.rate):>6} req/s  {ratio} on {point.measure}; {point.verdict.replace('_', ' ')}; "
        f"{decision} (units {point.units}, requests {point.requests}) <- {step.why}"
    )
