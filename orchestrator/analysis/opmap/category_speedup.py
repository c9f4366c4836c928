"""Per batch band, arm and workload category: the arm's per-token speedup over its `off` twin on the same requests
(the map's pairing: a request and its copy in the baseline arm, banded by the baseline's batch), with the interval
the pairs' spread allows, and the traffic samples' spread where the run has several. A schedule chosen on the
whole mix is checked with it per category (decide/recommend, decide/tune): a k that helps the mix can hurt the
category whose drafts are rejected most."""

from __future__ import annotations

import itertools
import math

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.opmap.operating_map import NO_CATEGORY
from orchestrator.analysis.opmap.results import OperatingMap, Verdict
from orchestrator.analysis.opmap.sample_spread import half_width
from orchestrator.analysis.read.source import Requests

# Over the map's `scored` view (operating_map.scored_sql, on the same connection, band set 0): per pair the log of
# baseline tpot / arm tpot, summed per traffic sample (the repeat: each draws its own requests). The interval is
# the wider of a normal one over pairs and Student's t across the samples (sample_spread.py), not the map's
# time-block bootstrap: a category's requests are spread over the run, and per category the blocks are too few.
_SQL = """
SELECT band_0, arm, category, repeat, count(*) AS pairs, sum(twin_log_tpot - log_tpot),
       sum((twin_log_tpot - log_tpot) * (twin_log_tpot - log_tpot))
FROM scored WHERE pair_0 AND both_usable AND band_0 >= 0
GROUP BY ALL ORDER BY band_0, arm, category NULLS FIRST, repeat
"""
MIN_PAIRS = 30  # fewer: no verdict for the category in that band


class CategorySpeedup(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    band: str
    band_index: int
    arm: str
    category: str
    pairs: int
    speedup: float  # baseline per-token latency / the arm's, geometric mean over the pairs (> 1: the arm faster)
    low: float | None  # 95% interval, across traffic samples too where there are several; None under 2 pairs
    high: float | None
    verdict: Verdict  # helps / hurts beyond the map's margin, no_difference, or insufficient_data (< MIN_PAIRS)
    samples: int = 1  # traffic samples (repeats) the pairs came from


def category_speedups(requests: Requests, batch_map: OperatingMap) -> list[CategorySpeedup]:
    """Every speculative arm's per-category speedup per band of `batch_map` (the run's band set 0), from the views
    operating_maps left on `requests.con`."""
    margin = batch_map.settings.margin
    out = []
    rows = requests.con.execute(_SQL).fetchall()
    for (band, arm, category), group in itertools.groupby(rows, key=lambda r: (r[0], r[1], r[2])):
        per_sample = [(float(total), int(n), float(squares)) for *_, n, total, squares in group]
        n = sum(p[1] for p in per_sample)
        total, squares = sum(p[0] for p in per_sample), sum(p[2] for p in per_sample)
        mean = total / n
        low = high = None
        if n >= 2:
            se = math.sqrt(max(squares - n * mean * mean, 0.0) / (n - 1) / n)
            half = half_width(se, mean, [(t, k) for t, k, _ in per_sample])
            low, high = math.exp(mean - half), math.exp(mean + half)
        if n < MIN_PAIRS or low is None or high is None:
            verdict = Verdict.INSUFFICIENT_DATA
        elif low > 1 + margin:
            verdict = Verdict.HELPS
        elif high < 1 / (1 + margin):
            verdict = Verdict.HURTS
        else:
            verdict = Verdict.NO_DIFFERENCE
        out.append(CategorySpeedup(
            band=batch_map.bands[int(band)].label, band_index=int(band), arm=str(arm),
            category=NO_CATEGORY if category is None else str(category), pairs=int(n), speedup=math.exp(mean),
            low=low, high=high, verdict=verdict, samples=len(per_sample),
        ))  # fmt: skip
    return out


def disagreeing_lines(rows: list[CategorySpeedup]) -> list[str]:
    """The answer split by category, where it differs by category: per (band, arm) whose categories' verdicts
    are not all the same (one helps, another hurts or shows no difference), every category's speedup."""
    cells: dict[tuple[int, str], list[CategorySpeedup]] = {}
    for r in rows:
        cells.setdefault((r.band_index, r.arm), []).append(r)
    out = []
    for (_, arm), mine in sorted(cells.items()):
        decided = {r.verdict for r in mine if r.verdict != Verdict.INSUFFICIENT_DATA}
        if len(decided) < 2:
            continue
        parts = [
            f"{r.category} {r.speedup:.2f}x"
            + (f" [{r.low:.2f}, {r.high:.2f}]" if r.low is not None and r.high is not None else "")
            + f" {r.verdict.value.replace('_', ' ')} (n={r.pairs})"
            for r in mine
        ]
        out.append(f"  batch {mine[0].band} {arm}: " + "; ".join(parts))
    samples = max((r.samples for r in rows), default=1)
    across = f"; intervals across {samples} traffic samples" if samples > 1 else ""
    head = f"by category, where the verdict differs (per-token speedup vs off on the same requests{across}):"
    return [head, *out] if out else []
