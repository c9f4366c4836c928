"""A rehearsal's check of what `specdrill tune` predicted: prediction.json's format (written by
orchestrator/decide/tune/prediction.py) and, band by band, whether the measured offered-rate map agrees with it. Here,
below decide/, because the report reads it: the report's summary must not import the decisions built on it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.analysis.opmap.bands import BandSet
from orchestrator.analysis.opmap.results import OperatingMap


class SeedRange(BaseModel):
    """A statistic over seeds: its median and the lowest and highest seed's value."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    median: float | None
    low: float | None
    high: float | None
    per_seed: list[float | None]

    @classmethod
    def of(cls, values: list[float]) -> SeedRange:
        finite = [v for v in values if math.isfinite(v)]
        seeds = [v if math.isfinite(v) else None for v in values]
        if not finite:
            return cls(median=None, low=None, high=None, per_seed=seeds)
        return cls(median=float(np.median(finite)), low=min(finite), high=max(finite), per_seed=seeds)

    def text(self) -> str:
        if self.median is None:
            return "n/a"
        return f"{self.median:.3f} [{self.low:.3f}, {self.high:.3f}]"


class PredictedArm(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    speedup: SeedRange  # off's per-token latency over the arm's, paired (> 1: faster than off)
    goodput: SeedRange  # the arm's share of requests meeting the SLO over off's
    tuned_over: SeedRange | None  # the arm's per-token latency over the tuned schedule's (> 1: tuned faster)


class PredictedBand(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    band: str
    arms: dict[str, PredictedArm]


class Prediction(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    campaign: str
    profile: str
    tuned_arm: str  # the tuned schedule's arm name in the rehearsal campaign
    schedule: list[list[int]] | None
    seeds: int
    bands: BandSet
    predicted: list[PredictedBand]


class BandAgreement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    band: str
    arm: str
    predicted: SeedRange
    measured: float | None
    measured_low: float | None
    measured_high: float | None
    difference: float | None  # measured minus the predicted median
    agrees: bool | None  # the measured interval meets the predicted range; None: nothing to compare

    def text(self) -> str:
        if self.agrees is None:
            return f"{self.band} {self.arm}: predicted {self.predicted.text()}, measured n/a: not compared"
        word = "agrees" if self.agrees else "DISAGREES"
        return (
            f"{self.band} {self.arm}: predicted speedup {self.predicted.text()}, measured {self.measured:.3f} "
            f"[{self.measured_low:.3f}, {self.measured_high:.3f}], difference {self.difference:+.3f}: {word}"
        )


def load_prediction(path: str) -> Prediction:
    try:
        return Prediction.model_validate(json.loads(Path(path).read_text()))
    except (OSError, ValueError, ValidationError) as exc:
        raise ValueError(f"prediction {path}: {str(exc).splitlines()[0]}") from None


def agreement(prediction: Prediction, rate_map: OperatingMap) -> list[BandAgreement]:
    """Per predicted band and arm present in the measured map: the measured per-token speedup against `off`
    (with its bootstrap interval) against the predicted range over seeds. Bands are matched by label: the
    report's automatic bands on the same traffic are the prediction's."""
    cells = {(c.band, c.arm): c for c in rate_map.cells}
    rows = []
    for band in prediction.predicted:
        for arm, predicted in band.arms.items():
            cell = cells.get((band.band, arm))
            ratio = cell.speedup.tpot if cell is not None and cell.speedup is not None else None
            if ratio is None or ratio.point is None or predicted.speedup.median is None:
                rows.append(
                    BandAgreement(
                        band=band.band,
                        arm=arm,
                        predicted=predicted.speedup,
                        measured=None,
                        measured_low=None,
                        measured_high=None,
                        difference=None,
                        agrees=None,
                    )
                )
                continue  # fmt: skip
            low = ratio.low if ratio.low is not None else ratio.point
            high = ratio.high if ratio.high is not None else ratio.point
            assert predicted.speedup.low is not None and predicted.speedup.high is not None
            agrees = low <= predicted.speedup.high and high >= predicted.speedup.low
            rows.append(
                BandAgreement(
                    band=band.band, arm=arm, predicted=predicted.speedup, measured=ratio.point, measured_low=low,
                    measured_high=high, difference=ratio.point - predicted.speedup.median, agrees=agrees,
                )
            )  # fmt: skip
    return rows


def prediction_check(path: str | None, maps: list[OperatingMap]) -> list[str]:
    """The report's lines for a campaign naming a prediction: one per band and arm, with a closing count; a
    prediction that cannot be read or compared says so in one line instead (the report itself still stands)."""
    if path is None:
        return []
    try:
        prediction = load_prediction(path)
    except ValueError as exc:
        return [f"{exc}: not compared"]
    rate_map = next((m for m in maps if m.measure == "offered_rate"), None)
    if rate_map is None:
        return [f"prediction {path}: this run has no offered-rate map (closed loop only): not compared"]
    rows = agreement(prediction, rate_map)
    compared = [r for r in rows if r.agrees is not None and r.arm == prediction.tuned_arm]
    agreed = sum(1 for r in compared if r.agrees)
    lines = [r.text() for r in rows if r.arm == prediction.tuned_arm]
    lines.append(
        f"{prediction.tuned_arm}: the measured map agrees with the prediction in {agreed} of {len(compared)} "
        f"offered-rate bands (speedup vs off; measured interval against the predicted range over "
        f"{prediction.seeds} seeds)"
    )
    return lines
