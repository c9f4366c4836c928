"""Engine lag: the real-time simulated engine says when the host could not keep up with its step schedule."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from orchestrator.analysis.gates import engine_lagged, evaluate_gates
from orchestrator.analysis.opmap.results import VerificationReport
from orchestrator.analysis.read.views import steps_view
from orchestrator.execute.ray_executor import engine_lag_of
from orchestrator.plan.campaign import load_campaign
from orchestrator.report.html import ReportData, render_report_html
from orchestrator.rundir.layout import RunStore, Unit, UnitResult
from orchestrator.rundir.unit_files import timeline_table, write_timeline
from serve_apps.engines.base import GenerationInput
from serve_apps.engines.simulated import SimulatedEngine
from serve_apps.policies import FixedPolicy
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.realtime import Finished, RealtimeEngine
from serve_apps.sim.request import SimRequest
from tests import REPO
from tools.agreement import compare_summaries, format_agreement

QUICKSTART = REPO / "campaigns" / "quickstart.yaml"


def _run(profile: Profile, time_scale: float) -> RealtimeEngine:
    async def scenario() -> RealtimeEngine:
        engine = RealtimeEngine(EngineCore(profile, FixedPolicy(method="eagle", model="d", k=3).resolve(), seed=1),
                                time_scale=time_scale)  # fmt: skip

        async def one(i: int) -> None:
            async for item in engine.generate(SimRequest(f"r{i}", "chat", 64, 30, 0.0)):
                if isinstance(item, Finished):
                    return

        try:
            await asyncio.gather(*(one(i) for i in range(4)))
        finally:
            await engine.stop()
        return engine

    return asyncio.run(scenario())


def test_every_step_has_its_lag_and_an_impossible_pace_shows_as_lag(eagle_profile: Profile) -> None:
    # Steps of a few microseconds of wall time: far faster than this interpreter can hand out tokens.
    engine = _run(eagle_profile, time_scale=1e-4)
    steps = engine.core.steps.count
    assert steps > 0 and len(engine.step_lag) == steps
    assert min(engine.step_lag) >= 0.0
    step_wall = (engine.core.steps.column("end") - engine.core.steps.column("start")) * 1e-4
    late = sum(1 for lag, wall in zip(engine.step_lag, step_wall, strict=True) if lag > wall)
    assert late >= steps // 2  # most steps ended later than the model says: the latencies are the host's
    assert engine.max_lag == max(engine.step_lag)


# --- engine lag from the engine to the report -----------------------------------------------------------------


def test_simulated_engine_timeline_carries_lag_per_step(eagle_profile: Profile) -> None:
    async def scenario() -> tuple[dict[str, list[Any]], dict[str, list[Any]], int]:
        engine = SimulatedEngine(eagle_profile, FixedPolicy(method="eagle", model="d", k=3).resolve(), seed=1,
                                 time_scale=1e-3, engine_id="e0")  # fmt: skip
        try:
            request = GenerationInput(
                request_id="r0", prompt_text="a b c", prompt_token_ids=None, max_tokens=20, ignore_eos=True
            )
            async for _ in engine.generate(request):
                pass
            return engine.timeline(), engine.timeline(since_step=2), engine._core.steps.count
        finally:
            await engine.stop()

    whole, tail, steps = asyncio.run(scenario())
    assert steps > 2
    assert len(whole["lag_s"]) == len(whole["start"]) == steps
    assert tail["lag_s"] == whole["lag_s"][2:]  # the same since_step window as every other column
    assert all(isinstance(x, float) and x >= 0.0 for x in whole["lag_s"])


def _steps(n: int, lag: list[float] | None, step_s: float = 0.010) -> dict[str, list[Any]]:
    data: dict[str, list[Any]] = {
        "start": [100.0 + i * step_s for i in range(n)],
        "end": [100.0 + (i + 1) * step_s for i in range(n)],
        "batch_size": [4] * n,
        "k": [3] * n,
    }
    if lag is not None:
        data["lag_s"] = lag
    return data


def test_timeline_file_has_lag_as_float64_only_when_an_engine_reports_it() -> None:
    with_lag = timeline_table({"a": _steps(3, [0.0, 0.001, 0.002]), "b": _steps(2, None)})
    assert with_lag.schema.field("lag_s").type == pa.float64()
    assert with_lag.column("lag_s").to_pylist() == [0.0, 0.001, 0.002, None, None]  # b reported none
    assert "lag_s" not in timeline_table({"vllm": _steps(3, None)}).column_names


def test_timelines_with_and_without_lag_read_together(tmp_path: Path) -> None:
    # A run resumed across this change has timeline files of both kinds: the analysis must read them all.
    store = RunStore(str(tmp_path / "run"))
    old, new = Unit(arm="off", shape="q", repeat=0), Unit(arm="off", shape="q", repeat=1)
    write_timeline(store, old, {"e": _steps(4, None)})
    write_timeline(store, new, {"e": _steps(3, [0.0, 0.0, 0.01])})
    con = duckdb.connect()
    arms = steps_view(con, store.root, [("off", "q", 0), ("off", "q", 1)])
    assert arms == frozenset({"off"})
    rows = con.execute("SELECT repeat, count(*) FROM steps GROUP BY repeat ORDER BY repeat").fetchall()
    assert rows == [(0, 4), (1, 3)]


def test_a_unit_with_injected_engine_lag_is_flagged() -> None:
    quiet = [0.0002] * 190 + [0.030] * 2  # rare long stalls on 10 ms steps: 5% of the model's time
    slow = [0.002] * 192  # every step 2 ms late: the engine ran 20% slower than its model
    kept = engine_lag_of({"e": _steps(192, quiet)}, bound=0.1)
    assert kept["engine_lagged"] is False
    assert kept["engine_lag_share"] == pytest.approx((190 * 0.0002 + 0.060) / 1.92)
    assert kept["engine_lag_max_s"] == pytest.approx(0.030)
    flagged = engine_lag_of({"e": _steps(192, slow)}, bound=0.1)
    assert flagged["engine_lagged"] is True and flagged["engine_lag_bound"] == 0.1
    assert flagged["engine_lag_share"] == pytest.approx(0.2)
    assert flagged["engine_lag_p50_s"] == flagged["engine_lag_p99_s"] == pytest.approx(0.002)
    assert engine_lag_of({"e": _steps(192, slow)}, bound=0.25)["engine_lagged"] is False
    # vLLM and virtual time report no lag: nothing to summarise, the unit keeps UnitResult's defaults.
    assert engine_lag_of({"vllm": _steps(10, None)}, bound=0.1) == {}


def _unit(arm: str, lag: dict[str, Any]) -> UnitResult:
    return UnitResult(
        unit=Unit(arm=arm, shape="ramp", repeat=0), start_ns=0, end_ns=1, duration_s=1.0, scheduled=10, rows=10,
        saturated=False, lateness_p99_s=0.0, workers=[], timeline_steps=200, **lag,
    )  # fmt: skip


def test_lagged_units_are_reported_and_fail_their_gate_when_asked() -> None:
    units = [
        _unit("off-single", engine_lag_of({"e": _steps(200, [0.002] * 200)}, bound=0.1)),
        _unit("fixed3-single", engine_lag_of({"e": _steps(200, [0.0002] * 200)}, bound=0.1)),
    ]
    assert engine_lagged(units) == [
        "off-single/ramp/r0: engine lag added 20% to the model's step time (bound 10%; p99 lag 2.0 ms)"
    ]
    campaign = load_campaign(QUICKSTART)
    verification = VerificationReport(arms=[], switch_timings=[], passed=True)
    assert not [g for g in evaluate_gates(campaign, [], verification, units) if g.gate == "engine_lagged"]
    strict = campaign.model_copy(update={"gates": campaign.gates.model_copy(update={"fail_on_engine_lag": True})})
    gates = [g for g in evaluate_gates(strict, [], verification, units) if g.gate == "engine_lagged"]
    assert [(g.arm, g.passed) for g in gates] == [("off-single", False)]
    data = ReportData(title="t", run="r", campaign="c", generated="now", manifest={}, maps=[],
                      verification=verification, engine_lagged_units=engine_lagged(units))  # fmt: skip
    html = render_report_html(data)
    assert "Engine lagged" in html and "off-single/ramp/r0" in html


# --- real time against virtual time -----------------------------------------------------------------------------


def _summary(cells: list[tuple[str, str, float | None, str]]) -> dict[str, Any]:
    def cell(arm: str, band: str, ratio: float | None, verdict: str) -> dict[str, Any]:
        return {"arm": arm, "band": band, "speedup": {"tpot": {"point": ratio}, "verdict": verdict}}

    baseline = [{"arm": "off", "band": band, "speedup": None} for band in {c[1] for c in cells}]
    rate_map = {"measure": "offered_rate", "cells": [*baseline, *(cell(*c) for c in cells)]}
    return {"run": "x", "maps": [{"measure": "batch_size", "cells": []}, rate_map]}


def test_agreement_compares_verdicts_and_ratios_band_by_band() -> None:
    real = _summary([("k3", "2-11 rps", 2.0, "helps"), ("k3", "11-24 rps", 1.0, "no_difference"),
                     ("k3", "24+ rps", 1.5, "helps"), ("k3", "0-2 rps", None, "insufficient_data")])  # fmt: skip
    virtual = _summary([("k3", "2-11 rps", 1.6, "helps"), ("k3", "11-24 rps", 1.5, "helps"),
                        ("k3", "0-2 rps", 1.7, "helps")])  # fmt: skip
    rows = {r.band: r for r in compare_summaries(real, virtual)}
    assert set(rows) == {"2-11 rps", "11-24 rps", "24+ rps", "0-2 rps"}  # the baseline's cells are not compared
    assert rows["2-11 rps"].agrees and rows["2-11 rps"].ratio_difference == pytest.approx(0.25)
    assert rows["11-24 rps"].comparable and not rows["11-24 rps"].agrees
    assert not rows["24+ rps"].comparable  # the virtual run has no cell there
    assert not rows["0-2 rps"].comparable and rows["0-2 rps"].ratio_difference is None
    assert format_agreement(list(rows.values()))[-1] == "verdicts agree in 1 of 2 comparable bands (4 bands in all)"
    assert compare_summaries(real, virtual, arms=["other"]) == []
