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
    """Edges at quantiles of the offered rates (equal request counts per band), rounded; an open top band."""
    finite = rates[np.isfinite(rates) & (rates > 0)]
    if not len(finite):
        raise ValueError("no offered rates to band: pass shapes or offered_rate to the request frame")
    # Quantiles from a strided sample: exact enough for band edges, cheap on 10 million rows.
    sample = finite[:: max(1, len(finite) // 200_000)]
    quantiles = np.quantile(sample, auto_rate_quantiles(count)).tolist()
    return rate_bands_at(quantiles, lowest=float(finite.min()), highest=float(finite.max()))


def auto_rate_quantiles(count: int = 5) -> list[float]:
    """The quantiles of the offered rates whose values become the automatic band edges."""
    return [float(q) for q in np.linspace(0, 1, count + 1)[1:-1]]


def rate_bands_at(
    quantile_values: Sequence[float], *, lowest: float | None = None, highest: float | None = None
) -> BandSet:
    """Edges at these rates, rounded down to numbers someone would pick; from 0, with an open top band.

    Where most requests were offered at one rate (a long hold at the peak, a step), the quantiles coincide and
    would leave every lower rate in one band: when they give fewer than half the bands asked for and the rates
    offered span more than that (`lowest`..`highest`), the edges are spread evenly over the span instead."""
    inner = sorted({_round_down(float(q)) for q in quantile_values} - {0.0})
    wanted = len(quantile_values) + 1
    if lowest is not None and highest is not None and len(inner) + 1 < (wanted + 1) // 2 and highest > lowest:
        step = (highest - lowest) / wanted
        spread = sorted({_round_down(lowest + step * i) for i in range(1, wanted)} - {0.0})
        if len(spread) > len(inner):
            inner = spread
    return rate_bands([0.0, *inner, math.inf])


def rate_bands_from_edges(edges: Sequence[float]) -> BandSet:
    """A campaign's own offered-rate band edges (analysis.rate_bands): [e0, e1), ..., and an open band above."""
    return rate_bands([*edges, math.inf])
