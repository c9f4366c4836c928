"""Acceptance per arm and workload category, over the whole run: what the drafter accepted of each category's
requests (the trace's per-request drafted and accepted counts), with the interval its sampling error allows, and,
on a simulated engine, the profile category whose acceptance it drafted with (a fallback where the request's own
category has none: serve_apps/sim/profile.py category_map, default_category)."""

from __future__ import annotations

import itertools
import math

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.opmap.operating_map import NO_CATEGORY
from orchestrator.analysis.opmap.sample_spread import half_width
from orchestrator.analysis.read.source import Requests
from serve_apps.sim.profile import Profile

FALLBACK_MARK = "simulated with its fallback"  # in the headline line fallback_lines writes

# One group per (arm, category, traffic sample): the sums a per-request ratio estimator and its variance need. A
# request is the sampling unit within a sample: its steps share its text (and, in the simulator, its category's
# acceptance), so the interval is over requests, not over draft tokens; across samples (the repeats, each its own
# requests) it is at least as wide as their spread (sample_spread.py).
_SQL = """
SELECT arm, category, repeat, count(*) AS requests, sum(drafted)::DOUBLE, sum(accepted)::DOUBLE,
       sum(spec_steps)::DOUBLE, sum(drafted * drafted)::DOUBLE, sum(accepted * accepted)::DOUBLE,
       sum(accepted * drafted)::DOUBLE, count(*) FILTER (WHERE drafted > 0) AS drafting
FROM requests GROUP BY arm, category, repeat ORDER BY arm, category NULLS FIRST, repeat
"""


class CategoryAcceptance(BaseModel):
    """One arm's acceptance on one workload category's requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    arm: str
    category: str
    requests: int
    drafted: int  # draft tokens verified
    accepted: int
    acceptance_rate: float | None  # accepted / drafted; None where nothing was drafted
    # 95% interval over requests (delta method on the ratio), widened to the spread between traffic samples where
    # the run has several; None under 2 drafting requests
    rate_low: float | None
    rate_high: float | None
    acceptance_length: float | None  # 1 + accepted drafts per drafting step
    # A simulated engine: the profile category whose acceptance these requests drafted with, where it is not
    # their own (a fallback); None on the request's own category or a real engine.
    drafted_as: str | None = None
    samples: int = 1  # traffic samples (repeats) the requests came from


def category_acceptance(requests: Requests, profile: Profile | None) -> list[CategoryAcceptance]:
    """Per arm and category, every arm (an `off` arm drafts nothing: its rates are None)."""
    out = []
    rows = requests.con.execute(_SQL).fetchall()
    for (arm, category), group in itertools.groupby(rows, key=lambda r: (r[0], r[1])):
        per_sample = [tuple(float(v) for v in r[3:]) for r in group]
        n, d, a, steps, dd, aa, ad, drafting = (sum(col) for col in zip(*per_sample, strict=True))
        name = NO_CATEGORY if category is None else str(category)
        rate = a / d if d > 0 else None
        low = high = None
        if rate is not None and drafting >= 2:
            # Var(sum a / sum d) ~ sum (a_i - r d_i)^2 / (m (m - 1) mean(d)^2) over the m drafting requests.
            residual = max(aa - 2 * rate * ad + rate * rate * dd, 0.0)
            se = math.sqrt(residual * drafting / (drafting - 1)) / d
            half = half_width(se, rate, [(s[2], s[1]) for s in per_sample])
            low, high = max(rate - half, 0.0), min(rate + half, 1.0)
        used = profile.resolve_category(name) if profile is not None and category is not None else None
        out.append(
            CategoryAcceptance(
                arm=str(arm), category=name, requests=int(n), drafted=round(d), accepted=round(a),
                acceptance_rate=rate, rate_low=low, rate_high=high,
                acceptance_length=1 + a / steps if steps > 0 else None,
                drafted_as=used if used is not None and used != name else None, samples=len(per_sample),
            )
        )  # fmt: skip
    return out


def fallback_lines(rows: list[CategoryAcceptance], profile: Profile | None) -> list[str]:
    """One line saying which categories drafted with another category's acceptance, with their request counts
    (over the run's arms, each request counted once: the arms send the same requests)."""
    if profile is None:
        return []
    fell: dict[tuple[str, str], int] = {}
    for r in rows:
        if r.drafted_as is not None:
            key = (r.category, r.drafted_as)
            fell[key] = max(fell.get(key, 0), r.requests)
    if not fell:
        return []
    parts = [f"{category} ({n} requests) as {used}" for (category, used), n in sorted(fell.items())]
    return [f"profile {profile.name} has no acceptance of its own for {len(fell)} categor"
            f"{'y' if len(fell) == 1 else 'ies'}; {FALLBACK_MARK}: {', '.join(parts)}"]  # fmt: skip


def acceptance_lines(rows: list[CategoryAcceptance]) -> list[str]:
    """The console's per-category acceptance: one line per arm that drafted, where the run has two categories or
    more (one category is the map's acceptance already)."""
    if len({r.category for r in rows}) < 2:
        return []
    by_arm: dict[str, list[CategoryAcceptance]] = {}
    for r in rows:
        if r.acceptance_rate is not None:
            by_arm.setdefault(r.arm, []).append(r)
    out = []
    for arm, mine in by_arm.items():
        parts = []
        for r in mine:
            interval = (
                f" [{r.rate_low:.3f}, {r.rate_high:.3f}]" if r.rate_low is not None and r.rate_high is not None else ""
            )
            length = f", length {r.acceptance_length:.2f}" if r.acceptance_length is not None else ""
            drafted_as = f", drafted as {r.drafted_as}" if r.drafted_as is not None else ""
            parts.append(f"{r.category} {r.acceptance_rate:.3f}{interval} (n={r.requests}{length}{drafted_as})")
        out.append(f"  {arm}: " + "; ".join(parts))
    samples = max(r.samples for r in rows)
    across = f" and across {samples} traffic samples" if samples > 1 else ""
    return [f"acceptance by category (accepted / drafted, 95% interval over requests{across}):", *out] if out else []
