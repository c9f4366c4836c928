"""A per-category figure's interval that carries the spread between traffic samples. One traffic sample is not
the truth: the campaign's repeats each draw their own arrivals and requests, and a category's figure can move
between them by more than its requests' spread within one suggests. The figures here are ratio estimators
(sum of numerators / sum of denominators: accepted / drafted, or summed log ratios / pairs); with two samples or
more, the between-sample standard error is the spread of the samples' residuals (each sample's numerator less
the pooled ratio times its denominator: samples weighted by their size), with Student's t on samples - 1 degrees
of freedom, as the search's rates take it across their units (t = 12.7 for two samples at 95%). The interval is
the wider of that and the within-sample one (over requests), so it is never narrower than either shows."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # the two-sided 95% normal quantile


def between_samples_se(point: float, samples: Sequence[tuple[float, float]]) -> float | None:
    """The standard error of sum(numerators) / sum(denominators) across samples, from (numerator, denominator)
    per sample; None under two samples (one sample shows no spread between samples)."""
    if len(samples) < 2:
        return None
    total = sum(d for _, d in samples)
    if total <= 0:
        return None
    residuals = sum((n - point * d) ** 2 for n, d in samples)
    return math.sqrt(residuals * len(samples) / (len(samples) - 1)) / total


def half_width(within_se: float, point: float, samples: Sequence[tuple[float, float]]) -> float:
    """The 95% interval's half width: Z95 x the within-sample error, widened to Student's t x the between-sample
    error where the figure has two samples or more."""
    within = Z95 * within_se
    between = between_samples_se(point, samples)
    if between is None:
        return within
    from scipy.special import stdtrit  # only a run with several traffic samples needs it

    return max(within, float(stdtrit(len(samples) - 1, 0.975)) * between)
