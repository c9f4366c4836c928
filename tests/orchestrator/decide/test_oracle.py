"""The simulator's ground truth (`specdrill simulate oracle`): the k that minimises per-token latency per batch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loadshapes.mixes import builtin_workload
from orchestrator.decide.oracle import Oracle, oracle
from serve_apps.policies import ResolvedSpeculation, validate_schedule
from serve_apps.sim.profile import Profile

SIZES = (1, 4, 16, 32, 64, 128, 256, 512)


@pytest.fixture(scope="module")
def eagle_oracle(eagle_profile: Profile) -> Oracle:
    return oracle(eagle_profile, workload=builtin_workload("reasoning"), max_k=4, batch_sizes=SIZES, seed=0)


def test_speculation_helps_most_when_the_gpu_is_idle(eagle_oracle: Oracle) -> None:
    first, last = eagle_oracle.points[0], eagle_oracle.points[-1]
    assert first.batch_size == 1 and first.best_k == 4  # the longest draft at batch 1
    assert last.best_k < first.best_k  # and shorter ones once the batch is large
    for point in eagle_oracle.points:
        assert point.tpot_p50_s[point.best_k] < point.tpot_p50_s[0]  # EAGLE at its best k beats no speculation
        assert point.best_k in point.near_best and all(
            point.tpot_p50_s[k] <= point.tpot_p50_s[point.best_k] * (1 + eagle_oracle.tolerance)
            for k in point.near_best
        )
    # Never a longer draft at a larger batch, up to ties within the oracle's tolerance.
    for smaller, larger in zip(eagle_oracle.points, eagle_oracle.points[1:], strict=False):
        assert min(larger.near_best) <= max(smaller.near_best)


def test_per_token_latency_agrees_with_the_batch_throughput(eagle_oracle: Oracle) -> None:
    """In a steady batch of B running requests each gets 1/B of the tokens: TPOT ~= B / throughput, with B the
    batch the engine really held (at 512 the KV cache holds fewer)."""
    for point in eagle_oracle.points:
        for k, tpot in point.tpot_p50_s.items():
            held = point.mean_batch[k]
            assert held <= point.batch_size + 1e-9
            assert tpot == pytest.approx(held / point.tokens_per_s[k], rel=0.2), (point.batch_size, k)
    assert eagle_oracle.points[0].mean_batch[0] == pytest.approx(1.0)


def test_the_oracle_schedule_is_valid_for_vllm_and_gives_the_best_k_at_every_measured_batch(
    eagle_oracle: Oracle,
) -> None:
    schedule = eagle_oracle.schedule()
    validate_schedule(schedule)
    resolved = ResolvedSpeculation(method="eagle", num_speculative_tokens=4, schedule=tuple(map(tuple, schedule)))
    for point in eagle_oracle.points:
        assert resolved.k_for_batch(point.batch_size, 512) == point.best_k == eagle_oracle.best_k(point.batch_size)
    assert eagle_oracle.best_k(20) == eagle_oracle.best_k(16)  # between measured sizes: the one below holds


def test_cli_oracle_json(tmp_path: object) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "simulate", "oracle",
         "--max-k", "2", "--batch-sizes", "1,64", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [p["batch_size"] for p in data["points"]] == [1, 64]
    assert set(data["points"][0]["tpot_p50_s"]) == {"0", "1", "2"}
    assert data["schedule"][0][0] == 1 and data["schedule"][-1][2] == data["points"][-1]["best_k"]
    bad = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "simulate", "oracle", "--max-k", "0"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "--max-k" in bad.stderr
