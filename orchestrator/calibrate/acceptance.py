"""Per-category, per-position acceptance from the trace's per-request speculation counters.

With per-step lists (load.store_step_lists, endpoint arms): position j's conditional acceptance is the share of
steps that drafted more than j tokens and accepted at least j in which position j was accepted too; a Wilson
interval per position. Without them, each request's totals (accepted and drafted tokens over its verify steps)
give only the mean accepted length per verify step at its k. Fixed-k arms of two or more ks identify the
positions from those means (positions.py). With fewer (one k, or only dynamic arms, whose requests mix k from
step to step so their totals cannot be split by k), one p for every position is solved from
sum_{j=1..k} p^j = that mean, pooled over the arms, with a bootstrap interval over requests, and the result says
positions 2..k are assumed equal to position 1, and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import duckdb
import numpy as np

from orchestrator.calibrate.positions import KTotals, describe_positions, fit_positions

Z95 = 1.959964


@dataclass(frozen=True)
class CategoryFit:
    category: str
    per_position: list[float]
    low: list[float]
    high: list[float]
    trials: list[int]  # steps that reached each position
    from_lists: bool  # False: from the per-request totals
    # Without lists: per position "measured" / "identified jointly" / "extrapolated" (positions.py), or empty
    # where one p stands for every position; `how` says which, per position with intervals, or why one p.
    basis: list[str] = field(default_factory=list)
    how: str = ""
    measured_k: int = 0  # the longest draft whose steps this fit read (past it nothing was measured); 0: not said


def wilson(successes: int, trials: int) -> tuple[float, float]:
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    d = 1 + Z95**2 / trials
    centre = (p + Z95**2 / (2 * trials)) / d
    half = Z95 * np.sqrt(p * (1 - p) / trials + Z95**2 / (4 * trials**2)) / d
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


_LISTS_SQL = """
SELECT category, j, count(*) FILTER (WHERE a >= j) AS reached, count(*) FILTER (WHERE a > j) AS accepted
FROM (
    SELECT category, unnest(per_step_drafted) AS d, unnest(per_step_accepted) AS a
    FROM trace WHERE status = 'ok' AND arm IN (SELECT arm FROM calibrate_arms) AND per_step_drafted IS NOT NULL
) s, range(0, {max_k}) r(j)
WHERE d > j GROUP BY category, j ORDER BY category, j
"""

_TOTALS_SQL = """
SELECT category, arm, accepted_tokens::DOUBLE AS accepted, drafted_tokens::DOUBLE AS drafted,
    spec_steps::DOUBLE AS steps
FROM trace WHERE status = 'ok' AND arm IN (SELECT arm FROM calibrate_arms) AND spec_steps > 0
"""


def _has_lists(con: duckdb.DuckDBPyConnection) -> bool:
    row = con.execute(
        "SELECT count(*) FROM trace WHERE arm IN (SELECT arm FROM calibrate_arms) AND per_step_drafted IS NOT NULL "
        "AND len(per_step_drafted) > 0"
    ).fetchone()
    return bool(row and row[0])


def fit_acceptance(con: duckdb.DuckDBPyConnection, arms: list[str], *, max_k: int, seed: int = 0,
                   fixed_k: Mapping[str, int] | None = None) -> list[CategoryFit]:  # fmt: skip
    """Per category, over the speculative `arms` of the `trace` view (run_views.run_requests). `fixed_k`: the
    fixed-k arms among them and their k (used to identify positions where there are no per-step lists)."""
    con.execute("CREATE OR REPLACE TEMP TABLE calibrate_arms AS SELECT unnest(?::VARCHAR[]) AS arm", [arms])
    if _has_lists(con):
        rows = con.execute(_LISTS_SQL.format(max_k=max(max_k, 1))).fetchall()
        by_category: dict[str, list[tuple[int, int, int]]] = {}
        for category, j, reached, accepted in rows:
            by_category.setdefault(str(category), []).append((int(j), int(reached), int(accepted)))
        out = []
        for category, positions in sorted(by_category.items()):
            positions = [p for p in positions if p[1] > 0]
            if not positions:
                continue
            intervals = [wilson(acc, reached) for _, reached, acc in positions]
            out.append(
                CategoryFit(
                    category=category,
                    per_position=[acc / reached for _, reached, acc in positions],
                    low=[lo for lo, _ in intervals],
                    high=[hi for _, hi in intervals],
                    trials=[reached for _, reached, _ in positions],
                    from_lists=True,
                    measured_k=len(positions),
                )
            )
        return out
    table = con.execute(_TOTALS_SQL).fetchnumpy()
    rng = np.random.default_rng(seed)
    out = []
    categories = np.asarray(table["category"], dtype=object)
    arm_of = np.asarray(table["arm"], dtype=object)
    for category in sorted({str(c) for c in categories}):
        mine = categories == category
        accepted, drafted, steps = (np.asarray(table[c], dtype=float)[mine] for c in ("accepted", "drafted", "steps"))
        by_k, left_out = _fixed_totals(arm_of[mine], accepted, drafted, steps, fixed_k or {})
        if len(by_k) >= 2:
            fit = fit_positions(by_k, positions=max(max_k, max(by_k)), seed=seed)
            how = describe_positions(category, fit)
            if left_out:
                how += f"; {left_out} requests of fixed arms left out (drafted tokens not k x their verify steps)"
            trials = [sum(n for k, n in fit.steps_by_k.items() if k > i) for i in range(len(fit.per_position))]
            out.append(CategoryFit(category, fit.per_position, fit.low, fit.high, trials, from_lists=False,
                                   basis=fit.basis, how=how, measured_k=max(by_k)))  # fmt: skip
            continue
        p = _geometric_p(accepted, drafted, steps)
        draws = [_geometric_p(*(v[idx] for v in (accepted, drafted, steps))) for idx in
                 (rng.integers(0, len(steps), len(steps)) for _ in range(200))]  # fmt: skip
        lo, hi = np.quantile(draws, [0.025, 0.975])
        why = f"only one fixed k measured (k={next(iter(by_k))})" if by_k else "no fixed-k arm measured it"
        how = (f"{category}: one p for every position, positions 2..{max_k} assumed equal to position 1: {why}, "
               f"and one k's mean accepted per step is one equation; {flat_consequence(p, max_k)}" if max_k > 1
               else f"{category}: one position (k = 1), measured")  # fmt: skip
        out.append(CategoryFit(category, [p], [float(lo)], [float(hi)], [int(steps.sum())], from_lists=False,
                               how=how, measured_k=max_k))  # fmt: skip
    return out


def flat_consequence(p: float, k: int) -> str:
    """What one p for k positions does to a decision. The measured mean m = p + p^2 + ... + p^k; any acceptance
    that does not rise with position and gives the same m has position 1 at or above p and position k at or below
    it (were position 1 below p, every position would be, and m smaller; likewise for position k). So the flat
    profile credits longer drafts with more than a falling acceptance gives them, and short ones with less."""
    mean = sum(p**j for j in range(1, k + 1))
    return (
        f"the {mean:.2f} accepted per step measured at k = {k} then has position 1 at or above {p:.3f} and "
        f"position {k} at or below it wherever acceptance falls with position (as every shipped profile's "
        f"does), so this profile overrates longer drafts and underrates shorter ones: an oracle or tune on it "
        f"leans to longer k than the engine's best (k past {k} is not offered: limits.max_draft_tokens); arms "
        f"at fixed k = {', '.join(str(j) for j in range(1, k))} as well would identify each position"
    )


def _fixed_totals(arms: np.ndarray, accepted: np.ndarray, drafted: np.ndarray, steps: np.ndarray,
                  fixed_k: Mapping[str, int]) -> tuple[dict[int, KTotals], int]:  # fmt: skip
    """The fixed arms' requests by k, and how many were left out: a request whose drafted tokens are not k times
    its verify steps drafted fewer than k somewhere (a drafter with nothing to propose, the context's end), so
    its steps are not all at k."""
    ks = np.array([fixed_k.get(str(a), 0) for a in arms])
    exact = (ks > 0) & (drafted == ks * steps)
    by_k = {int(k): KTotals(accepted[exact & (ks == k)], steps[exact & (ks == k)])
            for k in sorted(set(ks[exact].tolist()))}  # fmt: skip
    return by_k, int(((ks > 0) & ~exact).sum())


def _geometric_p(accepted: np.ndarray, drafted: np.ndarray, steps: np.ndarray) -> float:
    """The p with sum_j p^j (j = 1..k) = accepted tokens per verify step, pooled over k (k = drafted / steps)."""
    k = np.maximum(np.rint(drafted / steps), 1).astype(int)
    target = accepted.sum()
    steps_at = np.bincount(k, weights=steps)[1:]  # verify steps at each k = 1..max: one term per k, not per request
    exponents = np.arange(1, len(steps_at) + 1)

    def expected(p: float) -> float:
        return float((steps_at * np.cumsum(p**exponents)).sum())

    lo, hi = 0.0, 1.0
    for _ in range(50):  # expected() rises in p: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected(mid) < target else (lo, mid)
    return (lo + hi) / 2
