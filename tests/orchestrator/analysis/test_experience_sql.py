"""What users feel is defined once (loadshapes.experience) and the analysis' SQL gives the same answers on the
same rows: each request's goodput verdict, its latencies, the usable per-token latency of paired ratios, and the
report's quantiles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadshapes.experience import felt, quantile, quantiles
from loadshapes.slo import Deadlines, SloConfig
from orchestrator.analysis.opmap.measures import MEASURES
from orchestrator.analysis.opmap.slo import met_sql
from orchestrator.analysis.read.source import request_frame
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table

SLO = SloConfig(ttft_s=0.8, tpot_s=0.04, e2e_s=6.0, per_category={"code": Deadlines(tpot_s=0.2)})
N = 600


def _rows() -> dict[str, list[object]]:
    rng = np.random.default_rng(7)

    def maybe(values: np.ndarray, missing: float) -> list[float | None]:
        return [None if rng.random() < missing else float(v) for v in values]

    tpot = rng.lognormal(np.log(0.03), 0.5, N)
    tpot[rng.random(N) < 0.05] = 0.0  # two tokens in one step: measured, but no use to a ratio
    return {
        "status": list(rng.choice(["ok", "ok", "ok", "error", "timeout", "cancelled"], N)),
        "category": list(rng.choice(["chat", "code", "reasoning"], N)),
        "ttft_s": maybe(rng.lognormal(np.log(0.5), 0.6, N), 0.05),
        "tpot_s": maybe(tpot, 0.1),  # None: a one-token answer
        "e2e_s": maybe(rng.lognormal(np.log(4.0), 0.5, N), 0.05),
    }


def test_experience_and_the_analysis_sql_agree_on_every_request_and_quantile() -> None:
    rows = _rows()
    table = trace_table(arm=["a"] * N, scheduled_ns=START_NS + np.arange(N) * 10**6, **rows)  # type: ignore[arg-type]
    mine = felt(table, SLO)
    requests = request_frame(table)
    try:
        con = requests.con
        met, usable, ttft, e2e = (
            np.asarray(column, dtype=np.float64)
            for column in zip(
                *con.execute(
                    f"SELECT {met_sql(SLO)}::DOUBLE, CASE WHEN ok AND tpot > 0 THEN tpot END, "
                    "CASE WHEN ok THEN ttft END, CASE WHEN ok THEN e2e END FROM requests ORDER BY offset_s"
                ).fetchall(),
                strict=True,
            )
        )
        assert 0.2 < mine.met.mean() < 0.8  # the SLO discriminates: a test of the rule, not of all-or-nothing
        assert np.array_equal(mine.met, met.astype(bool))
        for name, ours, theirs in (("tpot", mine.tpot, usable), ("ttft", mine.ttft, ttft), ("e2e", mine.e2e, e2e)):
            assert np.array_equal(np.isnan(ours), np.isnan(theirs)), name
            assert np.array_equal(ours[~np.isnan(ours)], theirs[~np.isnan(theirs)]), name
        # The report's quantiles of each measure (completed requests only, NULL skipped) against ours.
        for measure in MEASURES:
            if measure.column not in ("ttft", "tpot", "e2e"):
                continue
            (sql,) = con.execute(
                f"SELECT quantile_cont({measure.column}, [0.5, 0.99]) FILTER (WHERE ok) FROM requests"
            ).fetchone()
            values = np.asarray(rows[f"{measure.column}_s"], dtype=np.float64)[np.asarray(rows["status"]) == "ok"]
            summary = quantiles(values[~np.isnan(values)])
            assert (summary.p50, summary.p99) == pytest.approx(tuple(sql), rel=1e-12), measure.name
    finally:
        requests.close()


def test_no_value_has_no_quantile() -> None:
    assert quantiles([]).p50 is None and math.isnan(quantile([], 0.5))
    assert quantile([1.0, 2.0, 4.0, 8.0], 0.5) == 3.0  # linear between the middle two, as quantile_cont
