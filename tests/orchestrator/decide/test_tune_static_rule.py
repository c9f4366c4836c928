"""`tune`'s static k on a data-parallel group is recommend's rule (the smallest k within the margin of the best,
the bands weighted by their requests), and what `tune` says while it searches goes to its own channel, a line per
stage and at most every few seconds within one."""

from __future__ import annotations

from orchestrator.decide.scoring import Cell, Scored, robust, score
from orchestrator.decide.tune.progress import TuneProgress
from orchestrator.decide.tune.static import smallest_within

MARGIN = 0.02


def _scored(k: int, latency: list[list[float]], goodput: float = 1.0) -> Scored:
    """k's cells: per band, its per-seed latency over off's (the same off for every k, so ratios pair)."""
    cells = [Cell(goodput=robust([goodput] * len(seeds), True), latency=robust(seeds, False)) for seeds in latency]
    return score(str(k), (0.0, 1, k), cells, list(range(len(latency))))


# The worked example's shape: k = 4 best everywhere; k = 3 3% behind in a quiet band of few requests and 1% in the
# busy one (1.3% weighted); k = 2 5-9% behind.
BEST = [[0.58, 0.58, 0.58], [0.60, 0.60, 0.60]]
THREE = [[0.5974, 0.5974, 0.5974], [0.606, 0.606, 0.606]]
TWO = [[0.632, 0.632, 0.632], [0.63, 0.63, 0.63]]


def test_the_smallest_k_within_the_margin_of_the_best_wins() -> None:
    scored = [_scored(2, TWO), _scored(3, THREE), _scored(4, BEST)]
    picked = smallest_within(scored, {0: 100.0, 1: 900.0}, MARGIN)
    assert (picked.k, picked.best) == (3, 4)
    assert abs(picked.over_best - 1.0119) < 1e-3  # 3% x 0.1 + 1% x 0.9, as a geometric mean
    assert abs(picked.per_band[0] - 1.03) < 1e-9
    # Weighted by requests, not band by band: the same k = 3 with the quiet band the busy one is 2.8%
    # behind, beyond the margin, and the best k stays
    assert smallest_within(scored, {0: 900.0, 1: 100.0}, MARGIN).k == 4


def test_goodput_first_a_smaller_k_that_meets_the_slo_less_is_not_within_the_margin() -> None:
    scored = [_scored(3, THREE, goodput=0.9), _scored(4, BEST)]
    assert smallest_within(scored, {0: 100.0, 1: 900.0}, MARGIN).k == 4


def test_speculation_off_is_the_smallest_k_when_it_is_within_the_margin() -> None:
    off = [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    near = [[0.995, 0.995, 0.995], [0.99, 0.99, 0.99]]
    assert smallest_within([_scored(0, off), _scored(1, near)], {0: 1.0, 1: 1.0}, MARGIN).k == 0


def test_tune_says_each_stage_and_at_most_every_few_seconds_within_one() -> None:
    now = [0.0]
    said: list[str] = []
    progress = TuneProgress(say=said.append, every_s=5.0, clock=lambda: now[0])
    progress.stage("searching schedules on replicas:2")
    for done in range(1, 13):
        now[0] += 1.0
        progress.step("searching schedules on replicas:2: candidates played", done)
    progress.step("playing 5 static k (0-4) on data_parallel:2", 1, 5, always=True)
    assert said == [
        "tune: searching schedules on replicas:2 (0 s)",
        "tune: searching schedules on replicas:2: candidates played ... 5 (5 s)",
        "tune: searching schedules on replicas:2: candidates played ... 10 (10 s)",
        "tune: playing 5 static k (0-4) on data_parallel:2 ... 1/5 (12 s)",
    ]
