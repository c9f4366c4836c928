"""`specdrill simulate fixed-batch`: what each batch size ran. Issue 40: a schedule with k = 0 at a batch size
printed an acceptance length of 1.86 there, counted over the whole run, whose ramp-up and drain pass through the
small batches where the schedule drafts. Graded against the profile's own per-position acceptance (closed form)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from loadshapes.mixes import builtin_workload
from orchestrator.cli import cli
from orchestrator.virtual.experiments import fixed_batch
from serve_apps.policies import DynamicPolicy, FixedPolicy
from serve_apps.sim.profile import Profile

SCHEDULE = "dynamic:3:1-4=3,5-512=0"  # k = 3 up to batch 4, none from 5


def _expected_length(per_position: list[float], k: int) -> float:
    """1 + E[accepted drafts] with position i accepted with p_i given 1..i-1 were (serve_apps/sim/profile.py)."""
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= per_position[min(i, len(per_position) - 1)]
        total += reach
    return total


def test_a_batch_size_the_schedule_gives_k_0_ran_no_drafts_and_accepted_none(eagle_profile: Profile) -> None:
    policy = DynamicPolicy.model_validate(
        {"method": "eagle", "model": eagle_profile.drafter_model, "max_k": 3, "schedule": [[1, 4, 3], [5, 512, 0]]}
    )
    small, large = fixed_batch(
        eagle_profile, policy, batch_sizes=[1, 8], workload=builtin_workload("reasoning"), seed=0
    )
    assert large.mean_executed_k == 0.0 and large.mean_acceptance_length is None
    assert small.mean_executed_k == pytest.approx(3.0)
    want = _expected_length(eagle_profile.acceptance["reasoning"].per_position, 3)  # 2.29
    assert small.mean_acceptance_length == pytest.approx(want, rel=0.03)


def test_fixed_k_keeps_its_acceptance_length_at_every_batch(eagle_profile: Profile) -> None:
    policy = FixedPolicy(method="eagle", model=eagle_profile.drafter_model, k=2)
    points = fixed_batch(eagle_profile, policy, batch_sizes=[1, 32], workload=builtin_workload("chat"), seed=0)
    want = _expected_length(eagle_profile.acceptance["chat"].per_position, 2)  # 1.68 + 0.374 = 2.05
    for point in points:
        assert point.mean_executed_k == pytest.approx(2.0)
        assert point.mean_acceptance_length == pytest.approx(want, rel=0.03)


def test_the_table_says_no_draft_was_verified_where_k_is_0() -> None:
    result = CliRunner().invoke(cli, ["simulate", "fixed-batch", "--policy", SCHEDULE, "--batch-sizes", "1,8"])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 5}
    cells = [c.strip() for c in rows["8"].split("│")[1:-1]]
    assert cells[-2:] == ["0.00", "-"]  # mean k, accept len
    assert [c.strip() for c in rows["1"].split("│")[1:-1]][-2] == "3.00"
    assert "accept len -: no step verified a draft at that batch size (k = 0 there)" in result.output
