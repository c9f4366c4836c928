"""`tune --design`'s per-band verdict on made-up figures: a design wins a band only when it is ahead of the next
beyond the margin AND beyond both intervals over seeds; otherwise the words say they cannot be told apart. With
one seed the figures are one traffic sample and the margin alone decides (a tie within it)."""

from __future__ import annotations

from orchestrator.analysis.steps.prediction_check import SeedRange
from orchestrator.decide.tune.designs import DesignBest, DesignsResult
from orchestrator.decide.tune.designs_words import words


def _result(a: list[float], b: list[float]) -> DesignsResult:
    """Two designs in one band, their per-seed speedups over off."""
    best = [
        DesignBest(design=name, policy=name, speedups=[SeedRange.of(s).median], ranges=[SeedRange.of(s)], candidates=1)
        for name, s in (("vllm_schedule", a), ("sglang_adaptive", b))
    ]
    return DesignsResult(bands=["0-10"], best=best, oracle_schedule=[[1, 512, 3]], oracle_speedups=[1.5],
                         oracle_ranges=[SeedRange.of([1.5] * len(a))], topology_why="the campaign's arms x run on it",
                         seeds=len(a), reach=20)  # fmt: skip


def _band(result: DesignsResult) -> str:
    return next(line for line in words(result) if line.startswith("  0-10 req/s: "))


def test_a_winner_is_ahead_beyond_the_margin_and_the_intervals() -> None:
    said = _band(_result([1.60, 1.62, 1.64], [1.50, 1.51, 1.52]))
    assert said == ("  0-10 req/s: vllm_schedule wins (1.62x [1.60, 1.64] over off, 1.07x ahead of sglang_adaptive "
                    "beyond the margin and the intervals)")  # fmt: skip


def test_ahead_beyond_the_margin_but_inside_the_intervals_cannot_be_told_apart() -> None:
    # 1.62 / 1.55 = 1.045: beyond the 2% margin at the median, but one seed of the second design reaches 1.63
    said = _band(_result([1.58, 1.62, 1.66], [1.50, 1.55, 1.63]))
    assert said.startswith("  0-10 req/s: vllm_schedule, sglang_adaptive cannot be told apart (within 2% or inside "
                           "each other's intervals over seeds) (1.62x [1.58, 1.66] over off)")  # fmt: skip


def test_one_seed_is_one_traffic_sample() -> None:
    result = _result([1.62], [1.55])
    lines = words(result)
    assert "one traffic sample (one seed: no interval" in lines[1] and "in virtual time" in lines[1]
    assert "  vllm_schedule: vllm_schedule (1 tried): 1.62x" in lines
    assert _band(result) == ("  0-10 req/s: vllm_schedule wins (1.62x over off, 1.05x ahead of sglang_adaptive "
                             "beyond the margin)")  # fmt: skip
    assert _band(_result([1.62], [1.60])).startswith("  0-10 req/s: vllm_schedule, sglang_adaptive tie within 2%")
