"""tune's answer checked per workload category: the schedule is searched on the whole traffic (every category's
requests together, never on the category that accepts best); here the answer and `off`, played on the same
requests, are compared per category, seed by seed, and a category the answer makes slower than plain decoding
beyond the margin in every seed is named."""

from __future__ import annotations

import numpy as np

from orchestrator.decide.played import Played


def _ratios(answer: Played, off: Played, mine: np.ndarray) -> list[float]:
    """Per seed: off's per-token latency over the answer's, geometric mean over the requests usable in both."""
    a, b = answer.latency["tpot"], off.latency["tpot"]
    usable = mine & np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    out = []
    for seed in sorted(set(off.seed.tolist())):
        pick = usable & (off.seed == seed)
        if pick.any():
            out.append(float(np.exp(np.mean(np.log(b[pick]) - np.log(a[pick])))))
    return out


def category_lines(answer: Played, off: Played, margin: float) -> list[str]:
    """What the answer does to each category against off; nothing where the traffic carries one category."""
    names = sorted({str(c) for c in off.category})
    if len(names) < 2:
        return []
    mix = _ratios(answer, off, np.ones(len(off.category), bool))
    lines = ["per category, the answer's per-token speedup over off, median [lowest, highest seed]: " + "; ".join(
        f"{c} {np.median(r):.2f}x [{min(r):.2f}, {max(r):.2f}]" for c in names
        if (r := _ratios(answer, off, off.category == c))
    )]  # fmt: skip
    helps = bool(mix) and min(mix) > 1 + margin
    for c in names:
        r = _ratios(answer, off, off.category == c)
        if r and max(r) < 1 / (1 + margin):  # slower than off beyond the margin in every seed
            slow = sorted(1 / x for x in r)
            said = f"helps the mix ({np.median(mix):.2f}x), hurts" if helps else "hurts"
            lines.append(f"the answer {said} {c}: per-token latency {np.median(slow):.2f}x off's "
                         f"[{slow[0]:.2f}x, {slow[-1]:.2f}x over {len(r)} seeds]")  # fmt: skip
    if len(lines) == 1:
        lines.append(f"no category is slower than off beyond the {margin:.0%} margin under the answer")
    return lines
