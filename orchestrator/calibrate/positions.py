"""Per-position acceptance from per-request totals, where arms of different fixed k identify the positions.

Without per-step lists a request tells only its accepted tokens and its verify steps. At a fixed k the mean
accepted per verify step is m_k = sum_{j=1..k} s_j, with s_j = p_1 * ... * p_j (position j accepted given 1..j-1
were). Measured ks k_1 < k_2 < ... split the positions into blocks (k_{i-1}, k_i]: m_{k_i} - m_{k_{i-1}} is the
sum of the block's s_j, one equation per block. A block of one position is measured exactly (k = 1 gives p_1,
k = 2 then p_2); in a longer block (k = 2 then 4: positions 3 and 4) only the block's total is identified, so its
positions share one value q, solved from s_{k_{i-1}} * (q + q^2 + ... + q^L) = m_{k_i} - m_{k_{i-1}}: no decay
inside a block, because one equation cannot say which; under a monotone non-increasing constraint alone any split
from (all on the first position) to (equal) fits. The pooled means are total accepted over total verify steps per
k, so every k's equation is weighted by its steps; with one equation per block the solve is exact. Positions past
the largest measured k are extrapolated: the last block's value (what the simulator's profile does past its
list). Intervals: a percentile bootstrap over requests, resampled within each k, seeded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

MEASURED, JOINT, EXTRAPOLATED = "measured", "identified jointly", "extrapolated"
DRAWS = 200
LEVEL = 0.95


@dataclass(frozen=True)
class PositionFit:
    per_position: list[float]
    low: list[float]
    high: list[float]
    basis: list[str]  # per position: MEASURED, JOINT or EXTRAPOLATED
    steps_by_k: dict[int, int]  # verify steps each measured k contributed


@dataclass(frozen=True)
class KTotals:
    """One k's requests: accepted tokens and verify steps, one entry per request."""

    accepted: np.ndarray
    steps: np.ndarray


def block_values(means: Mapping[int, float]) -> list[float]:
    """Per position 1..max k, from the mean accepted per verify step at each measured k (sorted ascending)."""
    out: list[float] = []
    survive, previous_k, previous_mean = 1.0, 0, 0.0
    for k in sorted(means):
        length, target = k - previous_k, means[k] - previous_mean
        q = _block_q(survive, length, target)
        out.extend([q] * length)
        survive *= q**length
        previous_k, previous_mean = k, means[k]
    return out


def _block_q(survive: float, length: int, target: float) -> float:
    """The q in [0, 1] with survive * (q + ... + q^length) = target, clipped where none is (sampling noise)."""
    if survive <= 0 or target <= 0:
        return 0.0
    if target >= survive * length:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(50):  # the sum rises in q: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if survive * sum(mid**j for j in range(1, length + 1)) < target else (lo, mid)
    return (lo + hi) / 2


def fit_positions(by_k: Mapping[int, KTotals], *, positions: int, seed: int = 0) -> PositionFit:
    """`by_k`: two or more fixed ks; `positions`: how many to write (at least the largest k); past the largest k
    the last value is extrapolated."""
    ks = sorted(by_k)
    point = block_values({k: _mean(by_k[k]) for k in ks})
    rng = np.random.default_rng(seed)
    draws = np.array([block_values({k: _mean(_resample(by_k[k], rng)) for k in ks}) for _ in range(DRAWS)])
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(draws, [tail, 1 - tail], axis=0)
    basis: list[str] = []
    previous = 0
    for k in ks:
        basis.extend([MEASURED if k - previous == 1 else JOINT] * (k - previous))
        previous = k
    extra = max(0, positions - ks[-1])
    return PositionFit(
        per_position=point + [point[-1]] * extra,
        low=[float(v) for v in low] + [float(low[-1])] * extra,
        high=[float(v) for v in high] + [float(high[-1])] * extra,
        basis=basis + [EXTRAPOLATED] * extra,
        steps_by_k={k: int(by_k[k].steps.sum()) for k in ks},
    )


def _mean(totals: KTotals) -> float:
    steps = totals.steps.sum()
    return float(totals.accepted.sum() / steps) if steps > 0 else 0.0


def _resample(totals: KTotals, rng: np.random.Generator) -> KTotals:
    pick = rng.integers(0, len(totals.steps), len(totals.steps))
    return KTotals(totals.accepted[pick], totals.steps[pick])


def describe_positions(category: str, fit: PositionFit) -> str:
    """One line: every position's value, interval and basis, which ks measured it, what is extrapolated."""
    cells = ", ".join(f"p{i + 1} {p:.3f} [{lo:.3f}, {hi:.3f}] {b}"
                      for i, (p, lo, hi, b) in enumerate(zip(fit.per_position, fit.low, fit.high, fit.basis,
                                                             strict=True)))  # fmt: skip
    ks = ", ".join(f"k={k} ({n} steps)" for k, n in fit.steps_by_k.items())
    last = max(fit.steps_by_k)
    return (f"{category}: {cells}; from fixed {ks}; positions past {last} extrapolated "
            f"(position {last}'s value, as the simulator repeats a profile's last position)")  # fmt: skip
