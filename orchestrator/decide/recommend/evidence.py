"""What `specdrill recommend` reads from a run's requests beside the report's per-band evidence (summary.json's
k_choices): how far the evidence of each batch band reaches, and the same evidence on finer bands.

- The measured range of a band: the `off` arm's (the batch frame's) requests in it, by their typical batch (the
  mean running batch over their steps, what bands them). A band 13-512 whose requests ran at batch 13-19 says
  nothing about batch 64: the schedule above 19 is inherited, not measured.
- Finer bands: each band cut at powers of two (1-2, 3-4, 5-8, 9-16, ...), with the report's own evidence rule
  (kchoice.choose_k) on them, so that a band is split where the evidence separates k inside it (a band 1-8 where
  k = 4 is faster than k = 3 beyond the margin at 1-2, and not at 5-8).
- The highest offered rate the `off` arm was sent: the load a follow-up starts from to reach beyond the band.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from orchestrator.analysis.opmap.bands import BandSet, batch_bands
from orchestrator.analysis.opmap.kchoice import BandChoice, choose_k
from orchestrator.analysis.opmap.operating_map import operating_maps
from orchestrator.analysis.read.db import EngineSettings
from orchestrator.analysis.read.inputs import RunInputs
from orchestrator.analysis.read.views import run_requests
from orchestrator.analysis.summary import Summary, schedule_bands

# The finer cuts inside every band: where the oracle's best k changes on the shipped profiles (1-2, 3-4, 5-8, ...)
FINE_CUTS = (1, 2, 3, 5, 9, 17, 33, 65, 129, 257, 513)


@dataclass(frozen=True)
class BatchEvidence:
    # per band of the report's batch bands: (lowest, highest) typical batch of the `off` arm's requests in it;
    # None where it has none
    measured: list[tuple[float, float] | None]
    fine: list[BandChoice]  # the report's evidence rule on finer bands (FINE_CUTS inside every band)
    peak_rate: float | None  # the highest offered rate of the `off` arm's requests, req/s


def fine_bands(bands: BandSet) -> BandSet:
    """Every band cut at FINE_CUTS inside it."""
    ranges: list[tuple[int, int]] = []
    for band in bands.bands:
        low, high = int(band.low), int(band.upper - 1) if band.high is not None else int(band.low)
        cuts = [low, *(c for c in FINE_CUTS if low < c <= high), high + 1]
        ranges += [(a, b - 1) for a, b in itertools.pairwise(cuts)]
    return batch_bands(ranges)


def batch_evidence(inputs: RunInputs, summary: Summary) -> BatchEvidence:
    campaign = inputs.campaign
    if not summary.maps or not summary.k_choices:
        return BatchEvidence(measured=[None] * len(summary.k_choices), fine=[], peak_rate=None)
    baseline = summary.maps[0].baseline
    bands = schedule_bands(inputs.planned)
    units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units]
    requests = run_requests(inputs.store.root, units, settings=EngineSettings.from_env())
    try:
        rows = requests.con.execute(
            f"SELECT {bands.sql('typical_batch')} AS band, min(typical_batch), max(typical_batch) FROM requests "
            "WHERE arm = ? AND typical_batch IS NOT NULL GROUP BY band",
            [baseline],
        ).fetchall()
        found = {int(band): (float(low), float(high)) for band, low, high in rows if band >= 0}
        peak = requests.con.execute("SELECT max(offered_rate) FROM requests WHERE arm = ?", [baseline]).fetchone()
        fine = fine_bands(bands)
        fine_map = operating_maps(requests, inputs.arms, campaign.slo, [fine])[0]
        dropped = {
            a.arm for a in summary.verification.arms for f in a.findings
            if f.failed and f.check in ("schedule_dropped", "static_fallback")
        }  # fmt: skip
        choices = choose_k(
            requests, fine_map, inputs.arms, band_set=0, max_k=max((a.k for a in inputs.arms), default=0),
            dropped=dropped,
        )  # fmt: skip
    finally:
        requests.close()
    rate = float(peak[0]) if peak and peak[0] is not None and math.isfinite(peak[0]) else None
    return BatchEvidence(measured=[found.get(i) for i in range(len(bands.bands))], fine=choices, peak_rate=rate)
