"""One arm against the baseline in one band: per-token latency and goodput ratios, bootstrap intervals, verdict.

Per-token latency is compared as a ratio of geometric means (request by request when the same requests ran in
both arms), so one stalled request cannot swing it; goodput as SLO-meeting completions per second of clock.
Every ratio is a function of column totals, so it is computed from per-block totals (bootstrap.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from orchestrator.analysis.opmap.bootstrap import between_runs_interval, interval, merge_blocks, resampled_totals
from orchestrator.analysis.opmap.results import MapSettings, Measure, RatioCI, Speedup, Verdict

# Columns of a cell's per-block totals (sums of log tpot over usable requests, usable requests, SLO-meeting
# completions, clock seconds), and of the per-pair ones.
LOG_TPOT, TPOT_USABLE, MET, CLOCK = range(4)
PAIR_COLUMNS = 6  # log tpot difference (base - arm), both usable, met arm, met base, clock arm, clock base


@dataclass(frozen=True)
class CellBlocks:
    """One cell's non-empty time blocks: (blocks, columns) totals, the columns of request_stats or pair_stats."""

    totals: np.ndarray
    rows: int


def weighted_log_mean(pairs: Iterable[tuple[float, float]]) -> float:
    """sum(w * ln v) / sum(w) over (weight, value) pairs: the logarithm of the weighted geometric mean by which
    recommend and tune weigh per-band ratios by their requests (one definition for both)."""
    listed = list(pairs)
    return sum(w * math.log(v) for w, v in listed) / sum(w for w, _ in listed)


def verdict_for(low: float | None, high: float | None, margin: float) -> Verdict:
    if low is None or high is None:
        return Verdict.INSUFFICIENT_DATA
    if low > 1 + margin:
        return Verdict.HELPS
    if high < 1 / (1 + margin):
        return Verdict.HURTS
    return Verdict.NO_DIFFERENCE


def combined_verdict(tpot: Verdict, goodput: Verdict) -> tuple[Verdict, Measure]:
    """Faster tokens bought with lost goodput do not help; either ratio hurting is enough to hurt. Returns the
    verdict and the measure that decided it. An inconclusive ratio counts as one without data."""
    tpot, goodput = (Verdict.INSUFFICIENT_DATA if v is Verdict.INCONCLUSIVE else v for v in (tpot, goodput))
    for verdict in (Verdict.HURTS, Verdict.HELPS):
        if tpot is verdict and goodput is verdict:
            return verdict, "both"
        if tpot is verdict:
            return verdict, "per-token latency"
        if goodput is verdict:
            return verdict, "goodput"
    if tpot is Verdict.INSUFFICIENT_DATA and goodput is Verdict.INSUFFICIENT_DATA:
        return Verdict.INSUFFICIENT_DATA, "neither"
    if goodput is Verdict.INSUFFICIENT_DATA:
        return Verdict.NO_DIFFERENCE, "per-token latency"
    if tpot is Verdict.INSUFFICIENT_DATA:
        return Verdict.NO_DIFFERENCE, "goodput"
    return Verdict.NO_DIFFERENCE, "both"


def _divide(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient: np.ndarray = np.asarray(np.divide(a, b), dtype=np.float64)
    return quotient


def _ratio(
    point: np.ndarray,
    draws: np.ndarray,
    settings: MapSettings,
    enough: bool,
    sides: list[tuple[np.ndarray, int]] | None = None,
) -> RatioCI:
    """The draws' percentile interval, or with `sides` (two runs', each resampled alone) between_runs_interval."""
    value = float(point)
    if not enough or not np.isfinite(value):
        return RatioCI(
            point=value if np.isfinite(value) else None, low=None, high=None, verdict=Verdict.INSUFFICIENT_DATA
        )
    if sides is None:
        bounds = interval(draws, settings.confidence)
    else:
        bounds = between_runs_interval(value, sides, settings.confidence)
    low, high = bounds if bounds else (None, None)
    return RatioCI(point=value, low=low, high=high, verdict=verdict_for(low, high, settings.margin))


def paired_ratios(
    pairs: CellBlocks, settings: MapSettings, rng: np.random.Generator, engines: float = 1.0
) -> tuple[RatioCI, RatioCI]:
    """Per-token speedup (base / arm, geometric means) and goodput ratio (arm / base) of paired requests."""
    t = pairs.totals.sum(axis=0)
    d = resampled_totals(merge_blocks(pairs.totals, settings.blocks), settings.bootstrap_samples, rng)
    tpot = _ratio(
        np.exp(_divide(t[0], t[1])), np.exp(_divide(d[:, 0], d[:, 1])), settings, bool(t[1] >= settings.min_requests)
    )
    goodput = _ratio(
        _divide(_divide(t[2], t[4]), _divide(t[3], t[5])) / engines,
        _divide(_divide(d[:, 2], d[:, 4]), _divide(d[:, 3], d[:, 5])) / engines,
        settings,
        pairs.rows >= settings.min_requests,
    )
    return tpot, goodput


def _unpaired(
    arm: CellBlocks,
    base: CellBlocks,
    settings: MapSettings,
    rng: np.random.Generator,
    engines: float,
    between_runs: bool,
) -> tuple[RatioCI, RatioCI]:
    a, b = arm.totals.sum(axis=0), base.totals.sum(axis=0)
    a_blocks, b_blocks = merge_blocks(arm.totals, settings.blocks), merge_blocks(base.totals, settings.blocks)
    a_draws = resampled_totals(a_blocks, settings.bootstrap_samples, rng)
    b_draws = resampled_totals(b_blocks, settings.bootstrap_samples, rng)

    def tpot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        ratio: np.ndarray = np.exp(
            _divide(y[..., LOG_TPOT], y[..., TPOT_USABLE]) - _divide(x[..., LOG_TPOT], x[..., TPOT_USABLE])
        )
        return ratio

    def goodput(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return _divide(_divide(x[..., MET], x[..., CLOCK]), _divide(y[..., MET], y[..., CLOCK])) / engines

    def sides(ratio: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> list[tuple[np.ndarray, int]] | None:
        """Each run resampled alone, the other held at its totals: between_runs_interval's input."""
        if not between_runs:
            return None
        return [(ratio(a_draws, b), len(a_blocks)), (ratio(a, b_draws), len(b_blocks))]

    enough = min(a[TPOT_USABLE], b[TPOT_USABLE]) >= settings.min_requests
    enough_rows = min(arm.rows, base.rows) >= settings.min_requests
    return (
        _ratio(tpot(a, b), tpot(a_draws, b_draws), settings, bool(enough), sides(tpot)),
        _ratio(goodput(a, b), goodput(a_draws, b_draws), settings, enough_rows, sides(goodput)),
    )


# A side that met its SLOs on at least this share of its requests carried the load it was offered: its goodput is
# the offered rate, not what its engines could do. An SLO is commonly set at p99, so 1% of misses is still carrying.
CARRIED_SHARE = 0.99


def _met_shares(arm: CellBlocks, base: CellBlocks, pairs: CellBlocks, paired: bool) -> tuple[float, float] | None:
    """The share of requests that met their SLOs in the arm and in its baseline (over the pairs when paired)."""
    if paired:
        t = pairs.totals.sum(axis=0)
        return (float(t[2] / pairs.rows), float(t[3] / pairs.rows)) if pairs.rows else None
    a, b = arm.totals.sum(axis=0), base.totals.sum(axis=0)
    return (float(a[MET] / arm.rows), float(b[MET] / base.rows)) if arm.rows and base.rows else None


def per_engine_goodput_note(goodput: RatioCI, shares: tuple[float, float] | None, baseline: str) -> str | None:
    """Why a per-engine goodput ratio cannot decide, or None where it can. Goodput per engine measures capacity
    per engine only on a side that failed users (it served less than it was offered); a side that carried the
    load served what it was offered. Both carried: the ratio is the engines' count, by construction. Only the
    arm carried: the ratio is a lower bound on its per-engine capacity ratio, so it can show helps, never hurts;
    only the baseline carried: an upper bound, so it can show hurts, never helps."""
    if shares is None or goodput.point is None:
        return None
    arm_carried, base_carried = (s >= CARRIED_SHARE for s in shares)
    said = f"{_share(shares[0])} of the arm's requests and {_share(shares[1])} of {baseline}'s met their SLOs"
    tolerance = f"at least {_share(CARRIED_SHARE)}"
    if arm_carried and base_carried:
        return f"both carried the load ({said}; {tolerance} is carrying)"
    if arm_carried and goodput.verdict is not Verdict.HELPS:
        return f"the arm carried the load and {baseline} did not ({said}): the ratio only bounds it from below"
    if base_carried and goodput.verdict is not Verdict.HURTS:
        return f"{baseline} carried the load and the arm did not ({said}): the ratio only bounds it from above"
    return None


def _share(value: float) -> str:
    text = f"{100 * value:.1f}%"
    return f"{100 * value:.2f}%" if text == "100.0%" and value < 1 else text  # 99.96%, never a rounded 100%


def _describe(ratio: RatioCI, what: str, note: str | None = None) -> str:
    if ratio.verdict is Verdict.INCONCLUSIVE and ratio.point is not None:
        return f"{what} {ratio.point:.2f}x inconclusive: {note or 'no verdict'}"
    if ratio.point is None:
        return f"{what} n/a"
    if ratio.low is None or ratio.high is None:
        return f"{what} {ratio.point:.2f}x (no interval: too few requests)"
    return f"{what} {ratio.point:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]"


def speedup(
    *,
    arm: CellBlocks,
    base: CellBlocks,
    pairs: CellBlocks,
    baseline: str,
    settings: MapSettings,
    rng: np.random.Generator,
    engines_ratio: float = 1.0,
    between_runs: bool = False,
) -> Speedup:
    """Pair by pair when enough of the smaller side has its partner in the band, else side against side. With
    engines_ratio N (the arm runs N engines, its baseline one), goodput is compared per engine. between_runs:
    `arm` and `base` are two runs' (compare), in blocks as long as the dependence between requests, and side
    against side gets between_runs_interval instead of the percentiles."""
    smaller = min(arm.rows, base.rows)
    paired = pairs.rows >= 2 and pairs.rows >= settings.min_paired_share * smaller
    if paired:
        tpot, goodput = paired_ratios(pairs, settings, rng, engines_ratio)
    elif smaller:
        tpot, goodput = _unpaired(arm, base, settings, rng, engines_ratio, between_runs)
    else:
        missing = RatioCI(point=None, low=None, high=None, verdict=Verdict.INSUFFICIENT_DATA)
        tpot, goodput = missing, missing
    note = None
    if engines_ratio != 1:
        note = per_engine_goodput_note(goodput, _met_shares(arm, base, pairs, paired), baseline)
        if note is not None:
            goodput = goodput.model_copy(update={"verdict": Verdict.INCONCLUSIVE})
    verdict, decided_by = combined_verdict(tpot.verdict, goodput.verdict)
    how = f"{pairs.rows} pairs" if paired else "unpaired"
    against = baseline if engines_ratio == 1 else f"{baseline} per engine ({engines_ratio:g} engines against 1)"
    goodput_name = "goodput per engine" if engines_ratio != 1 else "goodput"
    parts = {
        "per-token latency": _describe(tpot, "per-token speedup"),
        "goodput": _describe(goodput, goodput_name, note),
    }
    # The measure that decided the verdict comes first, so the interval read next to the verdict is its own.
    order = ["goodput", "per-token latency"] if decided_by == "goodput" else ["per-token latency", "goodput"]
    said = verdict.value.replace("_", " ")
    decided = "" if decided_by in ("both", "neither") else f" on {decided_by}"
    message = f"vs {against} ({how}): {said}{decided}: {parts[order[0]]}; {parts[order[1]]}"
    return Speedup(
        baseline=baseline,
        paired=paired,
        pairs=pairs.rows if paired else 0,
        tpot=tpot,
        goodput=goodput,
        verdict=verdict,
        decided_by=decided_by,
        engines_ratio=engines_ratio,
        message=message,
    )
