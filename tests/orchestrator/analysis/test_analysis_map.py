"""The operating map on small hand-built traces with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadshapes.slo import SloConfig
from orchestrator.analysis.opmap.bands import batch_bands, rate_bands
from orchestrator.analysis.opmap.operating_map import crossover, operating_map
from orchestrator.analysis.opmap.results import MapSettings, OperatingMap, Verdict
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import request_frame
from serve_apps.policies import FixedPolicy, OffPolicy
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table

OFF = ArmInfo.from_policy("off", OffPolicy())
FIXED = ArmInfo.from_policy("fixed", FixedPolicy(method="ngram", k=3))
ONE_BAND = rate_bands([0, math.inf])


def _latency_trace(
    n: int, ratio_by_band: list[float], *, paired: bool = True, seed: int = 0, spread: float = 0.5
) -> tuple[dict[str, list[object]], np.ndarray]:
    """n requests per band per arm; the fixed arm's tpot is the off arm's divided by the band's ratio."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list[object]] = {k: [] for k in ("arm", "request_id", "scheduled_ns", "ttft_s", "tpot_s", "e2e_s")}
    rates: list[float] = []
    for band, ratio in enumerate(ratio_by_band):
        base = rng.lognormal(np.log(0.02), spread, n)  # per-request difficulty, shared by both arms
        for arm, tpot in (("off", base), ("fixed", base / ratio * rng.lognormal(0, 0.05, n))):
            for i in range(n):
                index = band * n + i if paired or arm == "off" else 10**6 + band * n + i
                rows["arm"].append(arm)
                rows["request_id"].append(f"{arm}:s:0:{index}")
                rows["scheduled_ns"].append(START_NS + (band * n + i) * 10**9)
                rows["ttft_s"].append(0.1)
                rows["tpot_s"].append(float(tpot[i]))
                rows["e2e_s"].append(0.1 + 100 * float(tpot[i]))
                rates.append(10.0 * (band + 1))
    return rows, np.array(rates)


def test_counts_throughput_goodput_percentiles_k_and_acceptance() -> None:
    n = 100
    ok = np.arange(n) % 10 != 0  # every tenth request fails
    ttft = (np.arange(n) + 1) / 100  # 0.01 .. 1.00 s
    table = trace_table(
        arm=["off"] * n + ["fixed"] * n,
        scheduled_ns=np.tile(START_NS + np.arange(n) * 10**9, 2),
        status=np.where(np.tile(ok, 2), "ok", "error"),
        category=(["chat", "code"] * (n // 2)) * 2,
        ttft_s=np.tile(np.where(ok, ttft, np.nan), 2),
        tpot_s=[0.02] * n + [0.01] * n,
        e2e_s=np.tile(np.where(ok, ttft + 1.0, np.nan), 2),
        queue_wait_s=np.tile(np.arange(n) / 1000, 2),
        step_batch_size=[[4, 6, 8]] * n + [[20, 30, 40]] * n,
        step_k=[[0, 0, 0]] * n + [[3, 3, 3]] * n,
        per_step_drafted=[[]] * n + [[3, 3, 3]] * n,
        per_step_accepted=[[]] * n + [[2, 2, 2], [1, 1, 1]] * (n // 2),
    )
    frame = request_frame(table, offered_rate=np.full(2 * n, 2.0))  # each request stands for 0.5 s
    result = operating_map(frame, [OFF, FIXED], SloConfig(ttft_s=0.5, tpot_s=0.05), ONE_BAND)
    off, fixed = result.cell("0+", "off"), result.cell("0+", "fixed")
    finished = ttft[ok]
    assert (off.requests, off.completed) == (100, 90) and off.error_rate == pytest.approx(0.1)
    assert off.clock_s == pytest.approx(50.0) and off.throughput_rps == pytest.approx(90 / 50)
    met = int((finished <= 0.5).sum())  # 45 of the 90 completions meet the 0.5 s TTFT deadline
    assert off.goodput_rps == pytest.approx(met / 50) and off.goodput_fraction == pytest.approx(met / 100)
    expected = np.percentile(finished, [50, 90, 99])
    assert [off.ttft_s.p50, off.ttft_s.p90, off.ttft_s.p99] == pytest.approx(expected.tolist())
    assert off.queue_wait_s.p50 == pytest.approx(np.percentile(np.arange(n) / 1000, 50))
    assert off.tpot_s.p99 == pytest.approx(0.02) and fixed.tpot_s.p50 == pytest.approx(0.01)
    assert off.mean_executed_k == 0 and fixed.mean_executed_k == 3 and fixed.steps == 300
    assert off.acceptance_length is None and fixed.acceptance_length == pytest.approx(2.5)
    assert fixed.acceptance_length_by_category == {"chat": pytest.approx(3.0), "code": pytest.approx(2.0)}
    assert off.speedup is None and fixed.speedup is not None and fixed.speedup.paired
    assert fixed.speedup.tpot.point == pytest.approx(2.0) and fixed.speedup.goodput.point == pytest.approx(1.0)
    by_batch = operating_map(frame, [OFF, FIXED], SloConfig(), batch_bands())
    # The fixed arm ran at batch 20-40, its `off` twins at 4-8: each request is banded by its twin's batch, so
    # the band compares the same requests in both arms.
    assert by_batch.cell("1-8", "off").requests == 100 and by_batch.cell("1-8", "fixed").requests == 100
    shared = by_batch.cell("1-8", "fixed")
    assert shared.own_batch_band == 0 and shared.speedup is not None and shared.speedup.pairs == 100
    assert not [c for c in by_batch.cells if c.band == "9-32" and c.requests]
    assert OperatingMap.model_validate_json(result.model_dump_json()) == result


@pytest.mark.parametrize("paired", [True, False])
def test_speedup_interval_contains_the_true_ratio(paired: bool) -> None:
    rows, rates = _latency_trace(300, [1.5], paired=paired)
    frame = request_frame(trace_table(**rows), offered_rate=rates)
    cell = operating_map(frame, [OFF, FIXED], SloConfig(), ONE_BAND).cell("0+", "fixed")
    assert cell.speedup is not None and cell.speedup.paired is paired
    tpot = cell.speedup.tpot
    assert tpot.low is not None and tpot.high is not None
    assert tpot.low < 1.5 < tpot.high and tpot.verdict is Verdict.HELPS
    # Pairs cancel the per-request spread: the paired interval is far narrower.
    assert (tpot.high - tpot.low) < (0.05 if paired else 0.3)
    assert "per-token speedup 1.5" in cell.speedup.message and cell.speedup.verdict is Verdict.HELPS


def test_bootstrap_is_seeded_and_covers_the_truth_most_of_the_time() -> None:
    covered = 0
    for seed in range(20):
        rows, rates = _latency_trace(60, [1.2], paired=False, seed=seed)
        frame = request_frame(trace_table(**rows), offered_rate=rates)
        cell = operating_map(frame, [OFF, FIXED], SloConfig(), ONE_BAND).cell("0+", "fixed")
        assert cell.speedup is not None and cell.speedup.tpot.low is not None
        covered += cell.speedup.tpot.low <= 1.2 <= cell.speedup.tpot.high  # type: ignore[operator]
    assert covered >= 16  # a 95% interval; 20 draws
    again = operating_map(frame, [OFF, FIXED], SloConfig(), ONE_BAND).cell("0+", "fixed")
    assert again == cell


def test_verdicts_by_band_and_the_crossover() -> None:
    rows, rates = _latency_trace(200, [1.6, 1.3, 1.0, 0.7])
    frame = request_frame(trace_table(**rows), offered_rate=rates)
    result = operating_map(frame, [OFF, FIXED], SloConfig(), rate_bands([0, 15, 25, 35, math.inf]))
    verdicts = [result.cell(b.label, "fixed").speedup.verdict for b in result.bands]  # type: ignore[union-attr]
    assert verdicts == [Verdict.HELPS, Verdict.HELPS, Verdict.NO_DIFFERENCE, Verdict.HURTS]
    (cross,) = result.crossovers
    assert (cross.arm, cross.band, cross.band_index) == ("fixed", "25-35", 2)
    assert cross.message == "fixed: helps up to 15-25, stops at 25-35 (no difference)"


def test_a_margin_turns_a_small_gain_into_no_difference() -> None:
    rows, rates = _latency_trace(300, [1.05])
    frame = request_frame(trace_table(**rows), offered_rate=rates)
    strict = operating_map(frame, [OFF, FIXED], SloConfig(), ONE_BAND, settings=MapSettings(margin=0.0))
    loose = operating_map(frame, [OFF, FIXED], SloConfig(), ONE_BAND, settings=MapSettings(margin=0.1))
    assert strict.cells[1].speedup.verdict is Verdict.HELPS  # type: ignore[union-attr]
    assert loose.cells[1].speedup.verdict is Verdict.NO_DIFFERENCE  # type: ignore[union-attr]


def test_goodput_ratio_and_lost_goodput_hurts() -> None:
    rows, rates = _latency_trace(200, [1.3])
    n = len(rows["arm"])
    fixed = np.array(rows["arm"]) == "fixed"
    rows["status"] = ["error" if f and i % 2 else "ok" for i, f in enumerate(fixed)]  # half the fixed arm fails
    frame = request_frame(trace_table(**rows), offered_rate=rates)
    cell = operating_map(frame, [OFF, FIXED], SloConfig(tpot_s=1.0), ONE_BAND).cell("0+", "fixed")
    assert cell.speedup is not None and n == 400
    assert cell.speedup.goodput.point == pytest.approx(0.5)
    assert cell.speedup.tpot.verdict is Verdict.HELPS and cell.speedup.verdict is Verdict.HURTS


def test_crossover_skips_bands_without_data() -> None:
    verdicts = [("a", 0, Verdict.INSUFFICIENT_DATA), ("b", 1, Verdict.NO_DIFFERENCE)]
    # A thin band below is not the arm failing there, nor is the band above "even the lowest load" (issue 33)
    assert crossover("x", verdicts).message == (
        "x: does not help at b (no difference), the lowest load with a verdict; the 1 band below has too few "
        "requests for one"
    )
    assert crossover("x", verdicts[1:]).message == "x: does not help even at the lowest load (b: no difference)"
    per_engine = crossover("x", [("a", 0, Verdict.HELPS)], against="per engine against off, not on equal hardware")
    assert per_engine.message == "x (per engine against off, not on equal hardware): helps in every band with data"
    assert crossover("x", [("a", 0, Verdict.HELPS)]).band is None
    assert crossover("x", []).message == "x: no band with enough data"


def test_unconfigured_arms_and_baselines_are_refused() -> None:
    frame = request_frame(trace_table(arm=["off", "other"], scheduled_ns=[START_NS, START_NS]))
    with pytest.raises(ValueError, match="no ArmInfo: other"):
        operating_map(frame, [OFF], SloConfig(), ONE_BAND)
    # No baseline among the arms: every speedup is "insufficient data", never a traceback.
    arms = [OFF.model_copy(update={"baseline": False}), FIXED.model_copy(update={"name": "other"})]
    alone = operating_map(frame, arms, SloConfig(), ONE_BAND)
    assert all(c.speedup is not None and c.speedup.verdict is Verdict.INSUFFICIENT_DATA for c in alone.cells)
    # Several baselines: an arm must name the one it is compared with.
    three = request_frame(trace_table(arm=["off", "other", "fixed"], scheduled_ns=[START_NS] * 3))
    two = [OFF, OFF.model_copy(update={"name": "other"}), FIXED]
    with pytest.raises(ValueError, match="arm fixed: several baselines"):
        operating_map(three, two, SloConfig(), ONE_BAND)


def test_each_arm_is_compared_with_its_own_baseline_and_per_engine_when_normalised() -> None:
    rows, rates = _latency_trace(200, [1.5])
    rows2, _ = _latency_trace(200, [1.0], seed=1)
    # A second pair of arms on other hardware: `off2` and `fixed2` (no speedup there), and `dp` compared with
    # `off` per engine: the same per-token speedup, its goodput per engine halved.
    for name, source in (("off2", "off"), ("fixed2", "fixed"), ("dp", "fixed")):
        picked = [i for i, arm in enumerate(rows2["arm"] if name != "dp" else rows["arm"]) if arm == source]
        table = rows2 if name != "dp" else rows
        for key in list(rows):
            rows[key] = [*rows[key], *[table[key][i] for i in picked]]
        for i in range(len(rows["arm"]) - len(picked), len(rows["arm"])):
            rows["arm"][i] = name
            rows["request_id"][i] = str(rows["request_id"][i]).replace(f"{source}:", f"{name}:", 1)
    rates = np.concatenate([rates, rates[:200], rates[:200], rates[200:]])
    frame = request_frame(trace_table(**rows), offered_rate=rates)
    arms = [
        OFF, FIXED.model_copy(update={"compared_with": "off"}), OFF.model_copy(update={"name": "off2"}),
        FIXED.model_copy(update={"name": "fixed2", "compared_with": "off2"}),
        FIXED.model_copy(update={"name": "dp", "compared_with": "off", "engines_ratio": 2.0}),
    ]  # fmt: skip
    result = operating_map(frame, arms, SloConfig(), ONE_BAND)
    assert result.baselines == {"off": "off", "fixed": "off", "off2": "off2", "fixed2": "off2", "dp": "off"}
    assert result.is_baseline("off2") and not result.is_baseline("fixed2")
    fixed, fixed2, dp = (result.cell("0+", a).speedup for a in ("fixed", "fixed2", "dp"))
    assert fixed is not None and fixed2 is not None and dp is not None
    assert fixed.baseline == "off" and fixed2.baseline == "off2" and fixed.pairs == fixed2.pairs == 200
    assert fixed.tpot.point == pytest.approx(1.5, rel=0.05) and fixed2.tpot.point == pytest.approx(1.0, rel=0.05)
    assert dp.tpot.point == pytest.approx(fixed.tpot.point)
    assert dp.goodput.point == pytest.approx(fixed.goodput.point / 2) and dp.engines_ratio == 2.0
    # Both sides met their SLOs on >= 99% of requests (off misses 2 of 200): the halved per-engine goodput is the
    # engines' count, not capacity (issue 40: it flipped the verdict), so per-token latency decides
    assert "per engine (2 engines against 1)" in dp.message and dp.verdict is Verdict.HELPS
    assert dp.goodput.verdict is Verdict.INCONCLUSIVE and dp.decided_by == "per-token latency"
    assert (
        "inconclusive: both carried the load (100.0% of the arm's requests and 99.0% of off's met their SLOs; "
        "at least 99.0% is carrying)" in dp.message
    )


def test_sparse_request_ids_still_pair() -> None:
    rows, rates = _latency_trace(100, [1.5])
    # Indices a billion apart: too sparse for a lookup table, so pairs are found by sorting.
    rows["request_id"] = [
        f"{arm}:s:3:{int(str(rid).rsplit(':', 1)[1]) * 10**9}"
        for arm, rid in zip(rows["arm"], rows["request_id"], strict=True)
    ]
    frame = request_frame(trace_table(**rows), offered_rate=rates)
    cell = operating_map(frame, [OFF, FIXED], SloConfig(), ONE_BAND).cell("0+", "fixed")
    assert cell.speedup is not None and cell.speedup.paired and cell.speedup.pairs == 100
