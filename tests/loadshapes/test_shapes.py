from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from loadshapes.arrivals import shape_arrivals, worker_share
from loadshapes.shapes import Concurrency, CrossAndRecover, Day, Quiet, Ramp, Shape, Step, Sustained

SHAPES = TypeAdapter(Shape)


def test_rates_integrals_and_phases_of_cross_and_recover() -> None:
    s = CrossAndRecover(
        quiet_rate=2, peak_rate=20, boundary_rate=10, boundary="bs64", quiet_s=10, rise_s=20, hold_s=30, fall_s=20
    )
    assert [p.name for p in s.phases()] == [
        "quiet_before", "rise_past_bs64", "above_bs64", "fall_below_bs64", "quiet_after",
    ]  # fmt: skip
    assert s.duration == 90
    assert s.expected_requests == pytest.approx(2 * 10 + 11 * 20 + 20 * 30 + 11 * 20 + 2 * 10)
    np.testing.assert_allclose(s.rate_at([0, 10, 20, 30, 59.9, 70, 89.9, 90]), [2, 2, 11, 20, 20, 11, 2, 0])
    up, down = s.crossing_offsets()
    assert s.rate_at(up) == pytest.approx(10) and s.rate_at(down) == pytest.approx(10)
    assert list(s.phase_at([up + 1, down + 1])) == ["rise_past_bs64", "fall_below_bs64"]
    with pytest.raises(ValidationError, match="must hold for the load to cross the boundary"):
        CrossAndRecover(quiet_rate=2, peak_rate=8, boundary_rate=10, quiet_s=1, rise_s=1, hold_s=1, fall_s=1)


@given(
    st.lists(st.floats(0, 50), min_size=1, max_size=6),
    st.floats(0.5, 30),
    st.floats(0, 1),
)
@settings(max_examples=100, deadline=None)
def test_cumulative_is_the_integral_of_rate(rates: list[float], step_s: float, where: float) -> None:
    shape = Step(rates=rates, step_s=step_s)
    t = where * shape.duration
    grid = np.linspace(0, t, 20001)
    inside = np.minimum(grid, np.nextafter(shape.duration, 0))  # rate_at(duration) is 0: it is outside the shape
    numeric = np.trapezoid(shape.rate_at(inside), grid) if t > 0 else 0.0
    assert shape.cumulative(t) == pytest.approx(numeric, rel=1e-3, abs=1e-2 * max(rates) * step_s / 100 + 1e-9)
    assert shape.cumulative(shape.duration) == pytest.approx(shape.expected_requests)


def test_ramp_and_day() -> None:
    ramp = Ramp(rate_from=1, rate_to=9, duration_s=10)
    assert ramp.expected_requests == 50 and ramp.cumulative(5) == pytest.approx(5 + 0.5 * 0.8 * 25)
    day = Day(min_rate=1, max_rate=9, duration_s=240)
    assert day.rate_at(0) == pytest.approx(1) and day.rate_at(120) == pytest.approx(9)
    assert day.expected_requests == pytest.approx(5 * 240, rel=1e-2)


@pytest.mark.parametrize("process", ["poisson", "gamma", "constant"])
def test_arrivals_follow_the_rate(process: str) -> None:
    shape = CrossAndRecover(quiet_rate=5, peak_rate=50, boundary_rate=20, quiet_s=20, rise_s=20, hold_s=40, fall_s=20)
    times = shape_arrivals(shape, process=process, seed=11, cv=2.0)
    assert np.all(np.diff(times) >= 0) and times.min() >= 0 and times.max() <= shape.duration
    assert len(times) == pytest.approx(shape.expected_requests, rel=0.1)
    counts, edges = np.histogram(times, bins=12, range=(0, shape.duration))
    expected = np.diff(shape.cumulative(edges))
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected) * (2 if process == "gamma" else 1) + 3)


def test_poisson_gaps_are_exponential_and_gamma_is_burstier() -> None:
    flat = Sustained(rate=200, duration_s=100)
    poisson = np.diff(shape_arrivals(flat, process="poisson", seed=1))
    gamma = np.diff(shape_arrivals(flat, process="gamma", seed=1, cv=3.0))
    constant = np.diff(shape_arrivals(flat, process="constant", seed=1))
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, abs=0.05)
    assert gamma.std() / gamma.mean() == pytest.approx(3.0, rel=0.15)
    np.testing.assert_allclose(constant, 1 / 200)


def test_seeded_and_split_identically_across_workers() -> None:
    shape = Quiet(rate=30, duration_s=60)
    a = shape_arrivals(shape, seed=5)
    assert np.array_equal(a, shape_arrivals(shape, seed=5))
    assert not np.array_equal(a, shape_arrivals(shape, seed=6))
    for workers in (1, 3, 7):
        parts = [worker_share(a, w, workers) for w in range(workers)]
        assert sum(len(p) for p in parts) == len(a)
        assert np.array_equal(np.sort(np.concatenate(parts)), a)


def test_closed_loop_is_labelled_and_has_no_arrivals() -> None:
    shape = Concurrency(users=8, duration_s=30)
    assert shape.open_loop is False and shape.phases()[0].name == "closed_loop_8_users"
    with pytest.raises(ValueError, match="closed loop"):
        shape_arrivals(shape, seed=0)


def test_shapes_validate_from_data() -> None:
    shape = SHAPES.validate_python({"kind": "step", "rates": [1, 5, 2], "step_s": 10})
    assert isinstance(shape, Step) and shape.duration == 30
    with pytest.raises(ValidationError, match=r"rates\[1\] = -5"):
        SHAPES.validate_python({"kind": "step", "rates": [1, -5], "step_s": 10})
