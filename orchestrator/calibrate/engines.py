"""Pool or keep apart: do the runs' engines (one fit per run) cost the same? A coefficient both fits identify
differs where the two 95% intervals leave it apart (|a - b| > 1.96 sqrt(se_a^2 + se_b^2)) by more than a
material share of the larger value: with ten thousand steps a fit's interval is narrow enough to separate
engines that a replay could not tell apart, so a difference below MATERIAL is pooled."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from orchestrator.analysis.steps.stepfit import COEFFICIENTS, Z95, Fit

MATERIAL = 0.05


@dataclass(frozen=True)
class Difference:
    coefficient: str
    runs: tuple[str, str]
    values: tuple[float, float]
    intervals: tuple[tuple[float, float], tuple[float, float]]


@dataclass(frozen=True)
class EngineVerdict:
    differ: bool
    differences: list[Difference]
    lines: list[str]


def _differs(a: Fit, b: Fit, j: int) -> bool:
    gap = abs(float(a.coef[j] - b.coef[j]))
    spread = Z95 * math.hypot(float(a.stderr[j]), float(b.stderr[j]))
    return gap > spread and gap > MATERIAL * max(abs(float(a.coef[j])), abs(float(b.coef[j])))


def compare_engines(fits: dict[str, Fit]) -> EngineVerdict:
    differences = []
    for (ra, a), (rb, b) in itertools.combinations(fits.items(), 2):
        for j, name in enumerate(COEFFICIENTS):
            if a.fitted[j] and b.fitted[j] and _differs(a, b, j):
                pair = (float(a.coef[j]), float(b.coef[j]))
                differences.append(Difference(name, (ra, rb), pair, (a.interval(j), b.interval(j))))
    runs = ", ".join(fits)
    if not differences:
        return EngineVerdict(False, [], [
            f"engines of runs {runs}: every coefficient agrees within its 95% interval or by {MATERIAL:.0%}: "
            "one pooled fit"
        ])  # fmt: skip
    lines = [f"engines of runs {runs} differ: a separate fit per run"]
    for d in differences:
        (la, ha), (lb, hb) = d.intervals
        lines.append(
            f"  {d.coefficient}: {d.runs[0]} {d.values[0]:.4g} s [{la:.4g}, {ha:.4g}], "
            f"{d.runs[1]} {d.values[1]:.4g} s [{lb:.4g}, {hb:.4g}]"
        )
    return EngineVerdict(True, differences, lines)
