"""The simpler schedule wins: `tune`'s rule for k changes without a predicted effect, on the traffic's side
(no_predicted_gain: within the batch sizes the traffic reached, a k change stays only where the played traffic
predicts a gain beyond the margin in some band), on the oracle's side, and in words.

Above the largest batch the traffic reached, tune keeps the fixed-batch oracle's k: there the oracle's
measurement is the only prediction, and its own tolerance (the analysis' margin) is the margin. The oracle's
schedule as measured flips between k that it cannot tell apart (the quickstart's profile: 2 at 208, 1 at 224,
2 at 240, 1 at 256, each within 2% of the other), so a run of measured batch sizes whose every point lists its
neighbour's k among its near-best is merged into that neighbour, the merge that removes the most k changes first.
Every batch size the oracle measured keeps a k within its tolerance of the best there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from orchestrator.decide.oracle import Oracle
from orchestrator.decide.scoring import Scored, compare
from serve_apps.policies import ResolvedSpeculation, validate_schedule


def no_predicted_gain(schedule: Scored, simpler: Scored, bands: Sequence[int], margin: float) -> bool:
    """Whether `schedule` is predicted to gain nothing over `simpler` beyond the margin in any band: not better
    by the paired comparison (scoring.compare), and its median over seeds of the per-token latency ratio (simpler
    over schedule, paired) within the margin. Per band, not summed over bands: six bands 0.4% apart each are six
    gains inside the margin, not one of 2.4%."""
    for band in bands:
        if compare(schedule.cells[band], simpler.cells[band], margin) > 0:
            return False
        pairs = zip(simpler.cells[band].latency.per_seed, schedule.cells[band].latency.per_seed, strict=True)
        ratios = sorted(a / b for a, b in pairs if math.isfinite(a) and math.isfinite(b) and b > 0)
        if ratios and statistics.median(ratios) > 1 + margin:
            return False
    return True


def runs_of(ks: Sequence[int]) -> list[tuple[int, int]]:
    """The runs of equal k: (first index, one past the last)."""
    runs, start = [], 0
    for i in range(1, len(ks) + 1):
        if i == len(ks) or ks[i] != ks[start]:
            runs.append((start, i))
            start = i
    return runs


def simplest_oracle_ks(truth: Oracle) -> list[int]:
    """Per measured batch size (truth.points' order): the k of the simplest schedule within the oracle's tolerance
    that keeps its best k wherever no neighbour's k is near-best."""
    ks = [p.best_k for p in truth.points]
    near = [set(p.near_best) for p in truth.points]
    while True:
        runs = runs_of(ks)
        merges: list[tuple[int, int, int, int, int]] = []  # (-changes removed, points changed, lo, hi, k)
        for i, (lo, hi) in enumerate(runs):
            left = ks[runs[i - 1][0]] if i > 0 else None
            right = ks[runs[i + 1][0]] if i + 1 < len(runs) else None
            for k in {k for k in (left, right) if k is not None}:
                if all(k in near[x] for x in range(lo, hi)):
                    removed = 2 if left == right == k else 1
                    merges.append((-removed, hi - lo, lo, hi, k))
        if not merges:
            return ks
        _, _, lo, hi, k = min(merges)
        ks[lo:hi] = [k] * (hi - lo)


def simplest_oracle_schedule(truth: Oracle) -> list[list[int]]:
    """simplest_oracle_ks in vLLM's form, as Oracle.schedule: each measured batch size holds until the next."""
    ks = simplest_oracle_ks(truth)
    sizes = [p.batch_size for p in truth.points]
    entries: list[list[int]] = []
    for i, k in enumerate(ks):
        end = sizes[i + 1] - 1 if i + 1 < len(sizes) else sizes[i]
        if entries and entries[-1][2] == k:
            entries[-1][1] = end
        else:
            entries.append([sizes[i], end, k])
    entries[0][0] = 1
    validate_schedule(entries)
    return entries


def k_table(schedule: Sequence[Sequence[int]] | None, up_to: int) -> list[int]:
    """k at batch 1..up_to (index batch - 1); None: speculation off."""
    if schedule is None:
        return [0] * up_to
    resolved = ResolvedSpeculation(method="x", num_speculative_tokens=max(1, max(e[2] for e in schedule)),
                                   schedule=tuple((e[0], e[1], e[2]) for e in schedule))  # fmt: skip
    top = max(up_to, max(e[1] for e in schedule))
    return [resolved.k_for_batch(b, top) for b in range(1, up_to + 1)]


def differences(a: Sequence[Sequence[int]] | None, b: Sequence[Sequence[int]] | None, up_to: int) -> list[str]:
    """Where two schedules differ at batch 1..up_to: 'batch 16-22: k 2 -> 3' (a's k, then b's)."""
    ka, kb = k_table(a, up_to), k_table(b, up_to)
    out: list[str] = []
    start: int | None = None
    for batch in range(1, up_to + 2):
        differs = batch <= up_to and ka[batch - 1] != kb[batch - 1]
        same_pair = start is not None and differs and (ka[batch - 1], kb[batch - 1]) == (ka[start - 1], kb[start - 1])
        if start is not None and not same_pair:
            span = f"{start}" if start == batch - 1 else f"{start}-{batch - 1}"
            out.append(f"batch {span}: k {ka[start - 1]} -> {kb[start - 1]}")
            start = None
        if differs and start is None:
            start = batch
    return out
