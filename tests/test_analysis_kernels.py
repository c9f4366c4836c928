"""The compiled analysis kernels against plain numpy on the same rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from orchestrator.analysis.band_kernel import band_of
from orchestrator.analysis.cell_totals import cell_totals
from orchestrator.analysis.frame_kernels import clock_seconds_of, mean_of_sums
from orchestrator.analysis.lists import _chunk_sums, list_sums
from orchestrator.analysis.order_stats import grouped_quantiles


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    values = rng.lognormal(-3, 1, n)
    values[: n // 5] = np.round(values[: n // 5], 2)  # ties
    values[rng.random(n) < 0.02] *= -1
    values[rng.random(n) < 0.02] = np.nan
    values[rng.random(n) < 0.01] = np.inf
    return values


def _sorted_quantiles(values: np.ndarray, qs: list[float]) -> np.ndarray:
    """Linear interpolation between the order statistics, as low + (high - low) * fraction: numpy's own
    percentile rounds differently in the last bit for fractions above one half."""
    if not len(values):
        return np.full(len(qs), np.nan)
    ordered = np.sort(values)
    position = np.asarray(qs) / 100 * (len(ordered) - 1)
    below = np.floor(position).astype(np.int64)
    low, high = ordered[below], ordered[np.minimum(below + 1, len(ordered) - 1)]
    expected: np.ndarray = low + (high - low) * (position - below)
    return expected


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000, 300_000])
@pytest.mark.parametrize("masked", [False, True])
def test_grouped_quantiles_equal_sorted_order_statistics(n: int, masked: bool) -> None:
    rng = np.random.default_rng(n)
    groups = 5
    values = _values(rng, n)
    group = rng.integers(-1, groups, n).astype(np.int32)
    where = rng.random(n) < 0.8 if masked else None
    got = grouped_quantiles(values, group, groups, (50.0, 90.0, 99.0, 0.0, 100.0), where=where)
    for g in range(groups):
        keep = (group == g) & np.isfinite(values) & (True if where is None else where)
        np.testing.assert_array_equal(got[g], _sorted_quantiles(values[keep], [50, 90, 99, 0, 100]))
        if keep.any():
            np.testing.assert_allclose(got[g], np.percentile(values[keep], [50, 90, 99, 0, 100]), rtol=1e-14)


def test_grouped_quantiles_of_one_repeated_value_and_signed_zeros() -> None:
    same = grouped_quantiles(np.full(50, 0.25), np.zeros(50, dtype=np.int32), 1)
    np.testing.assert_array_equal(same, [[0.25, 0.25, 0.25]])
    mixed = np.array([-0.0, 0.0, -1.0, 3.0, -np.inf, 2.0])
    got = grouped_quantiles(mixed, np.zeros(6, dtype=np.int32), 1)
    np.testing.assert_array_equal(got[0], _sorted_quantiles(mixed[np.isfinite(mixed)], [50, 90, 99]))


def test_cell_totals_equal_bincounts() -> None:
    rng = np.random.default_rng(3)
    n, n_arms, n_bands, per_cell, n_categories, base = 50_000, 3, 4, 10, 3, 0
    band = rng.integers(-1, n_bands, n).astype(np.int32)
    arm = rng.integers(-1, n_arms, n).astype(np.int32)
    category = rng.integers(-1, n_categories - 1, n).astype(np.int32)
    run_block = rng.integers(0, per_cell, n).astype(np.int64)
    partner = np.where(rng.random(n) < 0.7, rng.integers(0, n, n), -1).astype(np.int64)
    usable = rng.random(n) < 0.9
    log_tpot = np.where(usable, rng.normal(-4, 1, n), 0.0)
    met, ok = rng.random(n) < 0.6, rng.random(n) < 0.95
    clock = rng.exponential(0.01, n)
    ints = [rng.integers(0, 50, n).astype(np.int32) for _ in range(4)]
    got = cell_totals(
        band=band,
        arm=arm,
        category=category,
        n_arms=n_arms,
        n_cells=n_arms * n_bands,
        n_categories=n_categories,
        base_code=base,
        run_block=run_block,
        per_cell=per_cell,
        partner=partner,
        stats=[log_tpot, usable, met, clock],
        additive=[ok, *ints],
    )
    banded = (band >= 0) & (arm >= 0)
    cell = np.where(banded, band * n_arms + arm, -1)
    np.testing.assert_array_equal(got.cell_of, cell)
    size = n_arms * n_bands * per_cell
    block = np.where(banded, cell * per_cell + run_block, size)

    def sums(codes: np.ndarray, column: np.ndarray, bins: int) -> np.ndarray:
        return np.bincount(codes, weights=column.astype(np.float64), minlength=bins + 1)[:bins]

    np.testing.assert_array_equal(got.counts, np.bincount(block, minlength=size + 1)[:size])
    for j, column in enumerate([log_tpot, usable, met, clock]):
        np.testing.assert_allclose(got.totals[:, j], sums(block, column, size), rtol=1e-12, atol=1e-12)
    slot = np.where(banded, cell * n_categories + category + 1, n_arms * n_bands * n_categories)
    for j, column in enumerate([ok, *ints]):
        np.testing.assert_array_equal(got.category_totals[:, j], sums(slot, column, len(got.category_counts)))
    at = np.where(partner >= 0, partner, 0)
    paired = banded & (partner >= 0) & (arm != base) & (band[at] == band)
    pair_block = np.where(paired, block, size)
    both = usable & usable[at]
    expected_pairs = [
        np.where(both, log_tpot[at] - log_tpot, 0.0),
        both,
        met,
        met[at],
        clock,
        clock[at],
    ]
    np.testing.assert_array_equal(got.pair_counts, np.bincount(pair_block, minlength=size + 1)[:size])
    for j, column in enumerate(expected_pairs):
        np.testing.assert_allclose(got.pair_totals[:, j], sums(pair_block, column, size), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("element", [pa.int16(), pa.int32(), pa.int64()])
@pytest.mark.parametrize("positive", [False, True])
def test_list_sums_from_buffers_equal_running_sums(element: pa.DataType, positive: bool) -> None:
    rng = np.random.default_rng(5)
    lists = [
        [None if rng.random() < 0.1 else int(x) for x in rng.integers(-3, 30_000, rng.integers(0, 6))]
        for _ in range(900)
    ]
    with_null_lists = [None if rng.random() < 0.05 else items for items in lists]
    for rows in (lists, with_null_lists):
        column = pa.chunked_array(
            [pa.array(rows[:400], pa.list_(element)), pa.array(rows[400:], pa.list_(element)).slice(37)]
        )
        got = list_sums(column, positive=positive)
        expected = [
            np.concatenate(parts) for parts in zip(*(_chunk_sums(c, positive) for c in column.chunks), strict=True)
        ]
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e)


def test_band_codes_equal_searchsorted_parity() -> None:
    rng = np.random.default_rng(9)
    values = np.concatenate([rng.uniform(-5, 600, 10_000), [np.nan, np.inf, -np.inf, 0.0, 8.0, 9.0, 513.0]])
    edges = np.array([1.0, 9.0, 9.0, 33.0, 40.0, 65.0, 65.0, np.inf])
    codes = np.empty(len(values), dtype=np.int32)
    band_of(values, edges, codes)
    position = np.searchsorted(edges, values, side="right")
    np.testing.assert_array_equal(codes, np.where(position & 1, position >> 1, -1))


def test_clock_seconds_equal_numpy_expression() -> None:
    rng = np.random.default_rng(11)
    n = 5_000
    offered = rng.uniform(-1, 50, n)
    offered[rng.random(n) < 0.1] = np.nan
    offered[rng.random(n) < 0.05] = np.inf
    mean_rate = np.array([10.0, np.nan, 0.0, 400.0, -1.0])
    run = rng.integers(0, len(mean_rate), n).astype(np.int64)
    got = np.empty(n)
    clock_seconds_of(offered, run, mean_rate, 20.0, got)
    run_rate = mean_rate[run]
    known = np.isfinite(offered) & (offered > 0)
    rate = np.where(known, np.maximum(offered, run_rate / 20.0), run_rate)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(got, np.where(np.isfinite(rate) & (rate > 0), 1.0 / rate, 0.0))
    sums, counts = rng.integers(0, 900, n).astype(np.int32), rng.integers(0, 4, n).astype(np.int32)
    means = np.empty(n)
    mean_of_sums(sums, counts, means)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(means, np.where(counts > 0, sums / counts, np.nan))
