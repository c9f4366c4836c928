"""What `specdrill tune` predicts a rehearsal will measure.

The prediction is an operating map in virtual time per offered-rate band (the bands the report will draw on the
same traffic): every single-engine arm of the campaign and the tuned schedule against `off` (paired per-token
speedup, goodput-share ratio) and the tuned schedule against each arm, each over seeds (median, lowest, highest).
`specdrill tune` writes it to prediction.json, which the rehearsal campaign names in its `prediction` key; the
report of that rehearsal compares its measured speedups with it band by band (the file's format and that check:
orchestrator/analysis/steps/prediction_check.py).
"""

from __future__ import annotations

import math

import numpy as np

from orchestrator.analysis.opmap.bands import BandSet
from orchestrator.analysis.steps.prediction_check import PredictedArm, PredictedBand, Prediction, SeedRange
from orchestrator.decide.played import Played

TUNED = "tuned"


def seed_ratios(base: Played, arm: Played, bands: BandSet, latency: str = "tpot") -> list[list[float]]:
    """Per band, per seed: the paired per-token speedup of `arm` over `base` (geometric mean of base / arm over
    the requests usable in both: the report's paired ratio)."""
    codes = bands.assign(base.offered_rate)
    seeds = sorted(set(base.seed.tolist()))
    a, b = arm.latency[latency], base.latency[latency]
    both = np.isfinite(a) & np.isfinite(b)
    out = []
    for band in range(len(bands.bands)):
        row = []
        for seed in seeds:
            mine = both & (codes == band) & (base.seed == seed)
            row.append(float(np.exp(np.mean(np.log(b[mine]) - np.log(a[mine])))) if mine.any() else math.nan)
        out.append(row)
    return out


def _share_ratio(base: Played, arm: Played, bands: BandSet) -> list[list[float]]:
    codes = bands.assign(base.offered_rate)
    seeds = sorted(set(base.seed.tolist()))
    out = []
    for band in range(len(bands.bands)):
        row = []
        for seed in seeds:
            mine = (codes == band) & (base.seed == seed)
            off = float(base.met[mine].mean()) if mine.any() else math.nan
            row.append(float(arm.met[mine].mean()) / off if mine.any() and off > 0 else math.nan)
        out.append(row)
    return out


def predict(
    campaign: str, profile: str, schedule: list[list[int]] | None, off: Played, arms: dict[str, Played],
    tuned_arm: str, bands: BandSet,
) -> Prediction:  # fmt: skip
    """`arms` by their rehearsal arm names, the tuned one among them under `tuned_arm`."""
    speedups = {name: seed_ratios(off, played, bands) for name, played in arms.items()}
    goodputs = {name: _share_ratio(off, played, bands) for name, played in arms.items()}
    tuned = arms[tuned_arm]
    over = {name: seed_ratios(played, tuned, bands) for name, played in arms.items() if name != tuned_arm}
    rows = []
    for b, band in enumerate(bands.bands):
        rows.append(
            PredictedBand(
                band=band.label,
                arms={
                    name: PredictedArm(
                        speedup=SeedRange.of(speedups[name][b]), goodput=SeedRange.of(goodputs[name][b]),
                        tuned_over=SeedRange.of(over[name][b]) if name in over else None,
                    )
                    for name in arms
                },
            )
        )  # fmt: skip
    return Prediction(
        campaign=campaign, profile=profile, tuned_arm=tuned_arm, schedule=schedule, seeds=len(set(off.seed.tolist())),
        bands=bands, predicted=rows,
    )  # fmt: skip
