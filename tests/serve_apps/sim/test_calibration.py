"""The shipped EAGLE profile reproduces the paper's fixed-batch speedups (Liu et al., arXiv 2601.11580)."""

from __future__ import annotations

import itertools

import pytest

from loadshapes.mixes import builtin_workload
from orchestrator.virtual.experiments import fixed_batch
from serve_apps.policies import FixedPolicy
from serve_apps.sim.profile import Profile

TARGETS = {1: 1.73, 128: 1.21}
BATCHES = [1, 8, 32, 64, 128]


@pytest.fixture(scope="module")
def curve(eagle_profile: Profile) -> dict[int, float]:
    policy = FixedPolicy(method="eagle", model=eagle_profile.drafter_model, k=3)
    points = fixed_batch(eagle_profile, policy, batch_sizes=BATCHES, workload=builtin_workload("reasoning"), seed=0)
    return {p.batch_size: p.speedup for p in points}


@pytest.mark.parametrize("batch", sorted(TARGETS))
def test_within_five_percent_of_the_paper(curve: dict[int, float], batch: int) -> None:
    assert abs(curve[batch] / TARGETS[batch] - 1) <= 0.05, curve


def test_speedup_declines_with_batch_size(curve: dict[int, float]) -> None:
    values = [curve[b] for b in BATCHES]
    assert all(a > b for a, b in itertools.pairwise(values)), values


def test_deterministic_for_a_seed(eagle_profile: Profile, curve: dict[int, float]) -> None:
    policy = FixedPolicy(method="eagle", model=eagle_profile.drafter_model, k=3)
    again = fixed_batch(eagle_profile, policy, batch_sizes=[1, 128], workload=builtin_workload("reasoning"), seed=0)
    assert {p.batch_size: p.speedup for p in again} == {1: curve[1], 128: curve[128]}
