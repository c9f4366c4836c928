"""Acceptance per position without per-step lists (issue 35): fixed k = 1, 2 and 4 arms identify the positions
from their requests' totals. Graded against the profile that generated the run, through the simulator's own
fixed-batch function, not against calibrate's objects."""

from __future__ import annotations

import duckdb
import pytest

from loadshapes.mixes import builtin_workload
from orchestrator.analysis.read.inputs import load_run
from orchestrator.analysis.read.views import run_requests
from orchestrator.calibrate.acceptance import fit_acceptance
from orchestrator.calibrate.command import Calibration, calibrate
from orchestrator.calibrate.positions import EXTRAPOLATED, JOINT, MEASURED, block_values
from orchestrator.plan.campaign import Campaign
from orchestrator.virtual.campaign import simulate_campaign
from orchestrator.virtual.experiments import fixed_batch
from serve_apps.policies import FixedPolicy
from serve_apps.sim.profile import CategoryAcceptance, Profile, load_profile
from tests.tiny_campaigns import sim_campaign

SHIPPED = "llama3.1-8b-h100-eagle"
FIXED = {"fixed1": 1, "fixed2": 2, "fixed4": 4}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Calibration, str]:
    policies = {"off": "off", **{name: f"fixed:{k}" for name, k in FIXED.items()}, "dyn": "dynamic:3:1-8=3,9-512=1"}
    data = sim_campaign(
        "positions",
        policies=policies,
        shapes={"ramp": {"kind": "ramp", "rate_from": 1, "rate_to": 30, "duration_s": 40}},
        mix={"entries": [{"workload": "chat", "weight": 2}, {"workload": "editing", "weight": 1}]},
    )  # no load.store_step_lists: the requests' totals only
    run = str(tmp_path_factory.mktemp("positions") / "run")
    simulate_campaign(Campaign.model_validate(data), output=run)
    return calibrate([run], name="fitted", check=False), run


def _truth(category: str, positions: int) -> list[float]:
    given = load_profile(SHIPPED).acceptance[category]
    return [given.prob(i) for i in range(positions)]


def test_positions_are_recovered_within_their_intervals_and_the_rest_is_said_extrapolated(
    fitted: tuple[Calibration, str],
) -> None:
    calibration, _ = fitted
    for fit in calibration.acceptance:
        assert not fit.from_lists
        assert fit.basis == [MEASURED, MEASURED, JOINT, JOINT], fit.category
        truth = _truth(fit.category, 4)
        for i, (want, got, lo, hi) in enumerate(zip(truth, fit.per_position, fit.low, fit.high, strict=True)):
            assert lo <= want <= hi, (fit.category, i + 1, lo, want, hi)
            assert abs(got - want) <= 0.03, (fit.category, i + 1, got, want)
    lines = "\n".join(calibration.lines)
    assert "past position 4: extrapolated" in lines
    assert "dynamic arms dyn-single left out" in lines
    notes = calibration.profile.calibration_notes
    assert "p3" in notes and "identified jointly" in notes and "positions past 4 extrapolated" in notes
    assert calibration.profile.acceptance["chat"].per_position == calibration.acceptance[0].per_position


def _k4_speedup(profile: Profile) -> float:
    policy = FixedPolicy(method="eagle", model=profile.drafter_model, k=4)
    (point,) = fixed_batch(profile, policy, batch_sizes=[1], workload=builtin_workload("chat"), seed=0)
    return point.speedup


def test_the_fitted_profile_predicts_k4s_low_load_speedup_of_the_true_one(fitted: tuple[Calibration, str]) -> None:
    calibration, run = fitted
    truth = load_profile(SHIPPED)
    # before: one p for every position, what calibrate fitted without the fixed arms' ks (the path kept for runs
    # of one k)
    inputs = load_run(run)
    requests = run_requests(run, [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units])
    try:
        arms = [f"{name}-single" for name in [*FIXED, "dyn"]]
        one_p = {c.category: c for c in fit_acceptance(requests.con, arms, max_k=4)}
    finally:
        requests.close()
    assert "assumed equal to position 1" in one_p["chat"].how
    before = truth.model_copy(update={"acceptance": {c: CategoryAcceptance(per_position=f.per_position)
                                                     for c, f in one_p.items()}})  # fmt: skip
    want = _k4_speedup(truth)
    before_points = 100 * (_k4_speedup(before) - want)
    after_points = 100 * (_k4_speedup(truth.model_copy(update={"acceptance": calibration.profile.acceptance})) - want)
    assert before_points > 5, before_points  # one p over-predicts k = 4: positions 3-4 are worse than the mean
    assert abs(after_points) < 1.5, after_points


def test_block_values_invert_the_mean_accepted_per_step() -> None:
    p = [0.8, 0.6, 0.5, 0.5]
    survive = [0.8, 0.48, 0.24, 0.12]
    means = {k: sum(survive[:k]) for k in (1, 2, 4)}
    assert block_values(means) == pytest.approx(p, abs=1e-9)
    # k = 2 and 4 only: positions 1-2 share one value, 3-4 another
    two = block_values({2: means[2], 4: means[4]})
    assert two[0] == two[1] and two[2] == two[3]
    assert two[0] + two[0] ** 2 == pytest.approx(means[2])


def _trace(rows: list[tuple[str, str, int, int, int]]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE trace (category VARCHAR, arm VARCHAR, status VARCHAR, accepted_tokens BIGINT, "
                "drafted_tokens BIGINT, spec_steps INTEGER, per_step_drafted SMALLINT[])")  # fmt: skip
    con.executemany("INSERT INTO trace VALUES (?, ?, 'ok', ?, ?, ?, NULL)", rows)
    return con


def test_one_k_keeps_one_p_and_says_why_and_inexact_requests_are_left_out() -> None:
    con = _trace([("chat", "f3", 150, 300, 100), ("chat", "f3", 140, 300, 100), ("chat", "dyn", 50, 150, 100)])
    (one,) = fit_acceptance(con, ["f3", "dyn"], max_k=3, fixed_k={"f3": 3})
    assert len(one.per_position) == 1 and not one.basis
    assert "positions 2..3 assumed equal to position 1: only one fixed k measured (k=3)" in one.how
    rows = [("chat", "f1", 80, 100, 100), ("chat", "f2", 128, 200, 100), ("chat", "f2", 100, 150, 100)]
    (two,) = fit_acceptance(_trace(rows), ["f1", "f2"], max_k=4, fixed_k={"f1": 1, "f2": 2})
    assert two.basis == [MEASURED, MEASURED, EXTRAPOLATED, EXTRAPOLATED]
    assert two.per_position == pytest.approx([0.8, 0.6, 0.6, 0.6])
    assert "1 requests of fixed arms left out" in two.how
