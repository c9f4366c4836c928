"""tune's answer checked per workload category and load band: the schedule is searched on the whole traffic
(every category's requests together, never on the category that accepts best); here the answer and `off`, played
on the same requests, are compared per (offered-rate band, category), seed by seed, and a category the answer
makes slower than plain decoding beyond the margin in every seed of a band is named with that band. A category
can be hurt only where the engine is busy (a verification step costs more at a large batch) while the whole run's
figure hides it. A band holding too few of a category's requests gives no advice: it is said to be thin."""

from __future__ import annotations

import numpy as np

from orchestrator.analysis.opmap.bands import BandSet
from orchestrator.analysis.opmap.category_speedup import MIN_PAIRS
from orchestrator.decide.played import Played


def _ratios(answer: Played, off: Played, mine: np.ndarray) -> list[float]:
    """Per seed: off's per-token latency over the answer's, geometric mean over the requests usable in both."""
    usable = mine & _usable(answer, off)
    a, b = answer.latency["tpot"], off.latency["tpot"]
    out = []
    for seed in sorted(set(off.seed.tolist())):
        pick = usable & (off.seed == seed)
        if pick.any():
            out.append(float(np.exp(np.mean(np.log(b[pick]) - np.log(a[pick])))))
    return out


def _usable(answer: Played, off: Played) -> np.ndarray:
    a, b = answer.latency["tpot"], off.latency["tpot"]
    usable: np.ndarray = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    return usable


def category_lines(answer: Played, off: Played, margin: float, bands: BandSet) -> list[str]:
    """What the answer does to each category against off, per band of `bands` (offered rate, the prediction's);
    nothing where the traffic carries one category. A (band, category) with fewer than MIN_PAIRS requests usable
    in both, over all seeds, is named as thin instead of checked."""
    names = sorted({str(c) for c in off.category})
    if len(names) < 2:
        return []
    lines = ["per category, the answer's per-token speedup over off, median [lowest, highest seed]: " + "; ".join(
        f"{c} {np.median(r):.2f}x [{min(r):.2f}, {max(r):.2f}]" for c in names
        if (r := _ratios(answer, off, off.category == c))
    )]  # fmt: skip
    codes = bands.assign(off.offered_rate)
    usable = _usable(answer, off)
    thin: list[str] = []
    for b, band in enumerate(bands.bands):
        here = codes == b
        mix = _ratios(answer, off, here)
        helps = bool(mix) and min(mix) > 1 + margin
        for c in names:
            mine = here & (off.category == c)
            n = int((mine & usable).sum())
            if n == 0:
                continue
            if n < MIN_PAIRS:
                thin.append(f"not enough requests of {c} in band {band.label} req/s ({n}, {MIN_PAIRS} needed)")
                continue
            r = _ratios(answer, off, mine)
            if max(r) < 1 / (1 + margin):  # slower than off beyond the margin in every seed
                slow = sorted(1 / x for x in r)
                said = f"helps the mix there ({np.median(mix):.2f}x), hurts" if helps else "hurts"
                spread = f"[{slow[0]:.2f}x, {slow[-1]:.2f}x over {len(r)} seeds]"
                lines.append(f"{band.label} req/s: the answer {said} {c}: per-token latency {np.median(slow):.2f}x "
                             f"off's {spread} on {n} requests")  # fmt: skip
    if len(lines) == 1:
        lines.append(f"no category is slower than off beyond the {margin:.0%} margin in any band under the answer")
    return [*lines, *thin]
