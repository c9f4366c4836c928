"""What users feel, defined once over per-request arrays: whether a request met the SLO (loadshapes.slo's rule,
`Deadlines.met`, for many requests at once), its latencies as the analysis reads them from a trace (a failed
request has none, a one-token answer no per-token latency), the per-token latency a paired ratio can use (> 0),
and the quantiles the report gives (DuckDB's quantile_cont is numpy's linear quantile).

The analysis computes the same in SQL over a run directory (orchestrator/analysis/: read/source.py's requests view,
opmap/slo.py's goodput, opmap/operating_map.py's quantiles and paired ratios); a test holds both to the same answers
on the same rows. Every in-memory decision reads users' experience here: tune's and search's played traffic, the
fixed-batch experiments the oracle is built on, and ground truth's open-loop sweeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from loadshapes.slo import SloConfig

LATENCIES = ("tpot", "ttft", "e2e")


class LatencySummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    p50: float | None
    p99: float | None


def quantile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The report's quantile: linear between the two nearest values (DuckDB quantile_cont); NaN of none."""
    arr = np.asarray(values, dtype=np.float64)
    return float(np.quantile(arr, q)) if arr.size else float("nan")


def quantiles(values: Sequence[float] | np.ndarray) -> LatencySummary:
    """p50 and p99 as the report takes them; None of no values."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return LatencySummary(p50=None, p99=None)
    p50, p99 = np.quantile(arr, [0.5, 0.99])
    return LatencySummary(p50=float(p50), p99=float(p99))


def _within(values: np.ndarray, limit: float | None) -> np.ndarray:
    # A deadline that is set: a missing (NaN) value misses it, as `_within` in loadshapes.slo.
    if limit is None:
        return np.ones(len(values), bool)
    with np.errstate(invalid="ignore"):
        return np.asarray(~np.isnan(values) & (values <= limit), bool)


def met(
    slo: SloConfig, categories: Sequence[str | None], *, ok: np.ndarray, ttft: np.ndarray, tpot: np.ndarray,
    e2e: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """`SloConfig.met` of every request (NaN: not measured): completed and within every deadline its category
    sets; a missing TTFT or end-to-end time misses a deadline that is set, a one-token answer (NaN per-token
    latency) cannot miss the per-token one."""
    cats = np.asarray(categories, dtype=object)
    out = np.zeros(len(cats), bool)
    for category in set(cats.tolist()):
        rows = cats == category
        deadlines = slo.for_category(category)
        with np.errstate(invalid="ignore"):
            tpot_ok = np.ones(int(rows.sum()), bool) if deadlines.tpot_s is None else ~(tpot[rows] > deadlines.tpot_s)
        out[rows] = ok[rows] & _within(ttft[rows], deadlines.ttft_s) & _within(e2e[rows], deadlines.e2e_s) & tpot_ok
    return out


def usable_tpot(ok: np.ndarray, tpot: np.ndarray) -> np.ndarray:
    """The per-token latency a paired ratio uses (the map's speedup: ok AND tpot > 0), NaN elsewhere: two tokens
    of one step have no time between them, and a log ratio no use for 0."""
    with np.errstate(invalid="ignore"):
        return np.where(ok & (tpot > 0), tpot, np.nan)


@dataclass(frozen=True)
class Felt:
    """Per request of a trace, in row order: what its user felt."""

    ok: np.ndarray
    met: np.ndarray  # ok and within the SLO: counts toward goodput
    ttft: np.ndarray  # seconds, NaN where not ok
    tpot: np.ndarray  # usable_tpot
    e2e: np.ndarray  # seconds, NaN where not ok
    offered_rate: np.ndarray  # req/s at the request's scheduled offset (NaN: closed loop)

    @classmethod
    def concat(cls, parts: Sequence[Felt]) -> Felt:
        names = ("ok", "met", "ttft", "tpot", "e2e", "offered_rate")
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in names})


def _floats(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def felt(table: pa.Table, slo: SloConfig) -> Felt:
    """A trace's rows (loadshapes.trace's schema) judged as the analysis judges them."""
    ok = np.asarray(table.column("status").to_pylist(), dtype=object) == "ok"
    measured = {name: np.where(ok, _floats(table, f"{name}_s"), np.nan) for name in LATENCIES}
    judged = met(slo, table.column("category").to_pylist(), ok=ok, ttft=measured["ttft"], tpot=measured["tpot"],
                 e2e=measured["e2e"])  # fmt: skip
    return Felt(
        ok=ok, met=judged, ttft=measured["ttft"], tpot=usable_tpot(ok, measured["tpot"]), e2e=measured["e2e"],
        offered_rate=_floats(table, "offered_rate_rps"),
    )  # fmt: skip
