"""Load bands: ranges of engine batch size or of offered arrival rate that the operating map is cut into."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Literal, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

DEFAULT_BATCH_RANGES: tuple[tuple[int, int], ...] = ((1, 8), (9, 32), (33, 64), (65, 128), (129, 256), (257, 512))


class Band(BaseModel):
    """Holds values with low <= value < high; high None: no upper bound (JSON has no infinity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    label: str
    low: float
    high: float | None

    @property
    def upper(self) -> float:
        return math.inf if self.high is None else self.high


class BandSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    measure: Literal["batch_size", "offered_rate"]
    unit: str
    bands: tuple[Band, ...]

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.bands:
            raise ValueError("a band set needs at least one band")
        for band in self.bands:
            if not band.low < band.upper:
                raise ValueError(f"band {band.label}: low {band.low} must be below high {band.high}")
        for before, after in itertools.pairwise(self.bands):
            if after.low < before.upper:
                raise ValueError(f"bands {before.label} and {after.label} overlap or are out of order")
        return self

    def assign(self, values: np.ndarray) -> np.ndarray:
        """Band index per value; -1 outside every band (and for NaN)."""
        # Edges low0, high0, low1, high1, ... (ordered, as the bands may not overlap): a value lies in band i
        # exactly when 2i + 1 edges are at or below it, so one binary search per value places it, gaps included.
        edges = np.array([edge for b in self.bands for edge in (b.low, b.upper)])
        at_or_below = np.searchsorted(edges, np.asarray(values, dtype=np.float64), side="right")
        codes: np.ndarray = np.where(at_or_below % 2 == 1, at_or_below // 2, -1).astype(np.int32)
        codes[np.isnan(values)] = -1
        return codes

    def sql(self, value: str) -> str:
        """The same assignment as a SQL expression of `value` (NULL: -1)."""
        cases = " ".join(
            f"WHEN {value} >= {b.low!r}" + ("" if b.high is None else f" AND {value} < {b.high!r}") + f" THEN {i}"
            for i, b in enumerate(self.bands)
        )
        return f"(CASE WHEN {value} IS NULL OR isnan({value}) THEN -1 {cases} ELSE -1 END)"


def batch_bands(ranges: Sequence[tuple[int, int]] = DEFAULT_BATCH_RANGES) -> BandSet:
    """Inclusive batch-size ranges, e.g. (1, 8), (9, 32)."""
    return BandSet(
        measure="batch_size",
        unit="requests per engine step",
        bands=tuple(Band(label=f"{lo}-{hi}", low=lo, high=hi + 1) for lo, hi in ranges),
    )


def _label(value: float) -> str:
    return f"{value:g}" if math.isfinite(value) else "inf"


def _rate_band(low: float, high: float) -> Band:
    if math.isinf(high):
        return Band(label=f"{_label(low)}+", low=low, high=None)
    return Band(label=f"{_label(low)}-{_label(high)}", low=low, high=high)


def rate_bands(edges: Sequence[float]) -> BandSet:
    """Consecutive edges in req/s: [e0, e1), [e1, e2), ...; end with math.inf for an open top band."""
    if len(edges) < 2:
        raise ValueError("rate bands need at least two edges")
    for low, high in itertools.pairwise(edges):
        if not low < high:
            raise ValueError(f"rate band edges must increase: {_label(low)} then {_label(high)}")
    return BandSet(
        measure="offered_rate",
        unit="req/s",
        bands=tuple(_rate_band(lo, hi) for lo, hi in itertools.pairwise(edges)),
    )


def _round_down(value: float) -> float:
    """To two significant digits, downwards, so a band edge reads like a number someone would pick."""
    if value <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(value)) - 1)
    return float(math.floor(value / scale) * scale)


def auto_rate_bands(rates: np.ndarray, count: int = 5) -> BandSet:
    """Automatic bands over these offered rates (rate_bands_at), from their quantiles at auto_rate_quantiles()."""
    finite = rates[np.isfinite(rates) & (rates > 0)]
    if not len(finite):
        raise ValueError("no offered rates to band: pass shapes or offered_rate to the request frame")
    # Quantiles from a strided sample: exact enough for band edges, cheap on 10 million rows.
    sample = finite[:: max(1, len(finite) // 200_000)]
    quantiles = np.quantile(sample, auto_rate_quantiles()).tolist()
    return rate_bands_at(quantiles, lowest=float(finite.min()), highest=float(finite.max()), count=count)


# The levels at which the offered rates' quantiles are read: every percentile, and finer below the first, where a
# quiet phase lies (1 req/s for a tenth of a campaign that peaks at 60 is 0.2% of its requests). Fine enough to
# recover how long the campaign offered each rate, which the automatic bands need as much as how many requests
# came at it.
_LEVELS = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, *(i / 100 for i in range(1, 100)))
# Two edges closer than this factor are one: a band between them would hold a sliver of the load.
_MERGE_FACTOR = 1.25


def auto_rate_quantiles() -> list[float]:
    """The quantiles of the offered rates that the automatic band edges are computed from (rate_bands_at)."""
    return list(_LEVELS)


def _time_quantiles(values: np.ndarray, levels: np.ndarray, wanted: Sequence[float]) -> list[float]:
    """Edges at quantiles of the offered rate over the campaign's time instead of its requests. A request offered
    at rate r stands for 1/r seconds, so between two read quantiles the time is the requests' share times the
    mean of 1/r there (1/r where they coincide: a plateau; the log-mean's inverse along a ramp). A quantile on a
    plateau (a quiet phase held at one rate) moves just above it, so the phase is inside the band it ends."""
    low, high = values[:-1], values[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        inverse = np.where(high > low, np.log(high / low) / (high - low), 1 / low)
    seconds = np.diff(levels) * inverse
    cumulative = np.concatenate([[0.0], np.cumsum(seconds)]) / seconds.sum()
    plateaus = set(low[high == low].tolist())
    edges = []
    for q in wanted:
        value = float(np.interp(q, cumulative, values))
        edges.append(_just_above(value) if value in plateaus else _round_down(value))
    return edges


def _just_above(value: float) -> float:
    """The next number of two significant digits above `value`: 1 -> 1.1, 40 -> 41."""
    scale = 10 ** (math.floor(math.log10(value)) - 1)
    return float(round((math.floor(value / scale + 1e-9) + 1) * scale, 12))


def rate_bands_at(
    quantile_values: Sequence[float], *, lowest: float | None = None, highest: float | None = None, count: int = 5
) -> BandSet:
    """Bands from the offered rates' quantiles at auto_rate_quantiles(), edges rounded down to numbers someone
    would pick, from 0 with an open top band.

    Edges at equal shares of the requests and at equal shares of the campaign's time, merged where closer than a
    factor of 1.25. Requests come in proportion to the rate, so request shares alone cut the peak finely and
    leave every quiet rate in one band with the busy ones below the peak (a 1 req/s quiet phase and a 30 req/s
    ramp in "0-40"); time shares give the quiet phases the campaign spends its time in their own band.

    Where most requests were offered at one rate (a long hold at the peak, a step), both put their edges at that
    rate and would leave every lower rate in one band: when they give fewer than half the bands asked for and the
    rates offered span more than that (`lowest`..`highest`), the edges are spread evenly over the span instead."""
    values = np.asarray(quantile_values, dtype=np.float64)
    levels = np.asarray(_LEVELS if len(values) == len(_LEVELS) else np.linspace(0, 1, len(values) + 2)[1:-1])
    shares = [i / count for i in range(1, count)]
    by_requests = [float(np.interp(q, levels, values)) for q in shares]
    by_time: list[float] = []
    if lowest is not None and highest is not None and lowest > 0 and highest > lowest:
        read = np.concatenate([[lowest], np.maximum.accumulate(np.clip(values, lowest, highest)), [highest]])
        by_time = _time_quantiles(read, np.concatenate([[0.0], levels, [1.0]]), shares)
    inner = sorted({_round_down(v) for v in by_requests} - {0.0})
    for edge in sorted(set(by_time) - {0.0}):
        if all(max(edge, e) / min(edge, e) >= _MERGE_FACTOR for e in inner):
            inner = sorted([*inner, edge])
    if lowest is not None and highest is not None and len(inner) + 1 < (count + 1) // 2 and highest > lowest:
        step = (highest - lowest) / count
        spread = sorted({_round_down(lowest + step * i) for i in range(1, count)} - {0.0})
        if len(spread) > len(inner):
            inner = spread
    return rate_bands([0.0, *inner, math.inf])


def rate_bands_from_edges(edges: Sequence[float]) -> BandSet:
    """A campaign's own offered-rate band edges (analysis.rate_bands): [e0, e1), ..., and an open band above."""
    return rate_bands([*edges, math.inf])
