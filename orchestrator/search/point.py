"""A rate the crossover search measured (orchestrator/search/bracket.py): its traffic samples (one per unit), the
ratio and interval across them, and what that evidence says, in one word and in the console's words."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

Side = Literal["above", "below", "unsure"]
# What a rate's evidence says, one word each: the interval above 1, below 1, including 1, missing, one traffic
# sample only (no spread between samples measured), or units that disagree with each other.
Standing = Literal["above", "below", "includes_1", "no_interval", "one_sample", "units_disagree"]


class SearchPoint(BaseModel):
    """One offered rate: every unit measured there (the same requests to both arms in each), each unit one traffic
    sample; the ratio and its interval across those samples (`across_samples`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: float
    ratio: float | None  # the deciding ratio, > 1 favours the arm: the geometric mean of the samples'
    low: float | None  # the interval across samples (None: fewer than two samples with a ratio)
    high: float | None
    measure: str  # "per-token latency" or "goodput": which ratio decided the analysis' verdict
    # The search's verdict of this rate (one of VERDICTS), from `standing`; the analysis' own verdict adds a
    # margin the search does not use, so it is not repeated here.
    verdict: str
    units: int
    requests: int  # sent to both arms together
    unit_sides: tuple[Side, ...] = ()  # each unit's own side of 1, alone: two that disagree decide nothing
    # Each counted unit's own deciding ratio, in the order run: the traffic samples the interval is taken across.
    # Empty in a search.json written before issue 40 (its interval was one pool's bootstrap: no standing now).
    samples: tuple[float, ...] = ()
    # Each sample's own standard error of its log ratio (its bootstrap interval's half-width / z): the floor of
    # the spread between samples (across_samples). Empty where the units had no interval.
    sample_errors: tuple[float, ...] = ()

    @property
    def ratio_text(self) -> str:
        """The ratio with its interval and how many traffic samples it rests on, as the console, the report and
        the benchmark print it."""
        if self.ratio is None:
            return "n/a"
        if len(self.samples) < 2:
            return f"{self.ratio:.3f} (one sample)"
        if self.low is None or self.high is None:
            return f"{self.ratio:.3f} (no interval)"
        return f"{self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}] across {len(self.samples)} samples"

    @property
    def standing(self) -> Standing:
        if self.ratio is None:
            return "no_interval"
        if len(self.samples) < 2:
            return "one_sample"
        if self.low is None or self.high is None:
            return "no_interval"
        if "above" in self.unit_sides and "below" in self.unit_sides:
            return "units_disagree"
        if self.low > 1:
            return "above"
        if self.high < 1:
            return "below"
        return "includes_1"

    @property
    def side(self) -> Side:
        """Of 1, as evidence: above or below it by the interval (units agreeing), else unsure."""
        standing = self.standing
        return standing if standing in ("above", "below") else "unsure"

    @property
    def helps(self) -> bool | None:
        """The side the search steers by: the interval's, else the point estimate's; None without a ratio."""
        if self.side != "unsure":
            return self.side == "above"
        return None if self.ratio is None else self.ratio > 1


def across_samples(samples: Sequence[float], confidence: float,
                   errors: Sequence[float] = ()) -> tuple[float, float | None, float | None]:  # fmt: skip
    """The ratio across traffic samples: the geometric mean of each unit's own ratio, and Student's t interval on
    their logs (n - 1 degrees of freedom), so the interval is as wide as the samples are apart and widened for how
    few there are (t = 12.7 for two). Each unit's ratio already carries its requests' noise, so the spread of the
    samples holds both; `errors` (each unit's own standard error of its log ratio, from its bootstrap) bound that
    spread from below: samples cannot truly lie closer together than each was measured, and two that happen to
    agree to 0.2% when each is +-2.5% (first.yaml, 5.72 req/s, 0.964 and 0.966 where the truth is ~1.06) would
    otherwise decide on a t interval of +-1.6%. One sample: the ratio, no interval."""
    from scipy.special import stdtrit  # only the search needs it

    logs = np.log(np.asarray(samples, dtype=np.float64))
    point = float(np.exp(logs.mean()))
    if len(logs) < 2:
        return point, None, None
    within = math.sqrt(float(np.mean(np.square(errors)))) if len(errors) else 0.0
    spread = max(float(logs.std(ddof=1)), within)
    half = float(stdtrit(len(logs) - 1, 0.5 + confidence / 2)) * spread / math.sqrt(len(logs))
    return point, point * math.exp(-half), point * math.exp(half)


# The search's verdict per standing, and the words the console prints for it: one verdict per rate.
VERDICTS: dict[Standing, str] = {
    "above": "helps",
    "below": "does_not_help",
    "includes_1": "undecided",
    "no_interval": "insufficient_data",
    "one_sample": "insufficient_data",
    "units_disagree": "undecided",
}
WORDS: dict[Standing, str] = {
    "above": "helps (interval above 1)",
    "below": "does not help (interval below 1)",
    "includes_1": "undecided (interval includes 1)",
    "no_interval": "insufficient (no interval: too few requests)",
    "one_sample": "insufficient (one traffic sample: the spread between samples not measured yet)",
    "units_disagree": "undecided (its units disagree: one above 1, one below)",
}


def rate_text(rate: float) -> str:
    return f"{rate:.3g}"


def rates_text(points: Sequence[SearchPoint]) -> str:
    return ", ".join(rate_text(p.rate) for p in points)
