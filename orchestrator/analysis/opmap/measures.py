"""The operating map's latency measures, one row each: what the map computes per band and arm (DuckDB's exact
quantiles of a column of the requests view), the field it has in every map cell (summary.json), and how the
console and report.html say it. A new measure is one row here; the map's query, its cells and their JSON, the
console table and the HTML cells read this table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

QUANTILES = (0.5, 0.9, 0.99)
QUANTILE_NAMES = ("p50", "p90", "p99")

Quantile = Literal["p50", "p90", "p99"]


@dataclass(frozen=True)
class Measure:
    name: str  # the map cell's field and summary.json's key
    column: str  # the requests view's column (orchestrator/analysis/read/source.py)
    label: str  # how the console and report.html name it
    description: str
    completed_only: bool  # quantiles over completed requests only (a failed request has no latency)
    unit: Literal["s"] = "s"
    direction: Literal["lower"] = "lower"  # which way is better
    console: tuple[Quantile, ...] = ()  # quantiles the console table shows, in ms
    console_rank: int = 0  # the console says the measures it shows in this order
    html: tuple[Quantile, ...] = ()  # quantiles report.html's map cells show


MEASURES: tuple[Measure, ...] = (
    Measure("ttft_s", "ttft", "TTFT", "time to first token, from the scheduled time", True,
            console=("p50",), console_rank=2, html=("p50", "p99")),
    Measure("tpot_s", "tpot", "TPOT", "time per output token after the first (requests with 2+ tokens)", True,
            console=("p50",), console_rank=1, html=("p50", "p99")),
    Measure("e2e_s", "e2e", "end-to-end", "scheduled time to last token", True),
    Measure("queue_wait_s", "queue_wait", "queue wait", "time waiting in the engine before the first step", False,
            html=("p50",)),
)  # fmt: skip

BY_NAME = {m.name: m for m in MEASURES}


def console_measures() -> list[Measure]:
    return sorted((m for m in MEASURES if m.console), key=lambda m: m.console_rank)
