"""Per-category, per-position acceptance from the trace's per-request speculation counters.

With per-step lists (load.store_step_lists, endpoint arms): position j's conditional acceptance is the share of
steps that drafted more than j tokens and accepted at least j in which position j was accepted too; a Wilson
interval per position. Without them, each request's totals (accepted and drafted tokens over its verify steps)
give only the mean accepted length per verify step at its k: one p for every position is solved from
sum_{j=1..k} p^j = that mean, with a bootstrap interval over requests, and the result says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np

Z95 = 1.959964


@dataclass(frozen=True)
class CategoryFit:
    category: str
    per_position: list[float]
    low: list[float]
    high: list[float]
    trials: list[int]  # steps that reached each position
    from_lists: bool  # False: one p for all positions, from the per-request totals


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
SELECT category, accepted_tokens::DOUBLE AS accepted, drafted_tokens::DOUBLE AS drafted, spec_steps::DOUBLE AS steps
FROM trace WHERE status = 'ok' AND arm IN (SELECT arm FROM calibrate_arms) AND spec_steps > 0
"""


def _has_lists(con: duckdb.DuckDBPyConnection) -> bool:
    row = con.execute(
        "SELECT count(*) FROM trace WHERE arm IN (SELECT arm FROM calibrate_arms) AND per_step_drafted IS NOT NULL "
        "AND len(per_step_drafted) > 0"
    ).fetchone()
    return bool(row and row[0])


def fit_acceptance(con: duckdb.DuckDBPyConnection, arms: list[str], *, max_k: int, seed: int = 0) -> list[CategoryFit]:
    """Per category, over the speculative `arms` of the `trace` view (run_views.run_requests)."""
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
                )
            )
        return out
    table = con.execute(_TOTALS_SQL).fetchnumpy()
    rng = np.random.default_rng(seed)
    out = []
    categories = np.asarray(table["category"], dtype=object)
    for category in sorted({str(c) for c in categories}):
        mine = categories == category
        accepted, drafted, steps = (np.asarray(table[c], dtype=float)[mine] for c in ("accepted", "drafted", "steps"))
        p = _geometric_p(accepted, drafted, steps)
        draws = [_geometric_p(*(v[idx] for v in (accepted, drafted, steps))) for idx in
                 (rng.integers(0, len(steps), len(steps)) for _ in range(200))]  # fmt: skip
        lo, hi = np.quantile(draws, [0.025, 0.975])
        out.append(CategoryFit(category, [p], [float(lo)], [float(hi)], [int(steps.sum())], from_lists=False))
    return out


def _geometric_p(accepted: np.ndarray, drafted: np.ndarray, steps: np.ndarray) -> float:
    """The p with sum_j p^j (j = 1..k) = accepted tokens per verify step, pooled over k (k = drafted / steps)."""
    k = np.maximum(np.rint(drafted / steps), 1).astype(int)
    target = accepted.sum()

    def expected(p: float) -> float:
        return float(sum(s * sum(p**j for j in range(1, kk + 1)) for s, kk in zip(steps, k, strict=True)))

    lo, hi = 0.0, 1.0
    for _ in range(50):  # expected() rises in p: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected(mid) < target else (lo, mid)
    return (lo + hi) / 2
