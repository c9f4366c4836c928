"""A "tie" claims equality: only where the leaders' interval includes 1 (issue 40: "fixed2-single, fixed3-single tie
for best (... 0.94x [0.90, 0.99])"). The comparisons are planted (their intervals known), the map is a small
hand-built trace, so the words are graded against intervals the code under test did not compute."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadshapes.slo import SloConfig
from orchestrator.analysis.answer import ArmComparison, answer_of
from orchestrator.analysis.opmap.bands import rate_bands
from orchestrator.analysis.opmap.operating_map import operating_map
from orchestrator.analysis.opmap.results import RatioCI, Verdict, VerificationReport
from orchestrator.analysis.opmap.speedup import verdict_for
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import request_frame
from orchestrator.report.html.answer_table import answer_section
from serve_apps.policies import FixedPolicy, OffPolicy
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table

OFF = ArmInfo.from_policy("off", OffPolicy())
A = ArmInfo.from_policy("fixed2", FixedPolicy(method="ngram", k=2), compared_with="off")
B = ArmInfo.from_policy("fixed3", FixedPolicy(method="ngram", k=3), compared_with="off")
N = 60


def _ratio(point: float, low: float, high: float) -> RatioCI:
    return RatioCI(point=point, low=low, high=high, verdict=verdict_for(low, high, 0.02))


def _answer(a_vs_b: RatioCI) -> list[str]:
    arms = ["off", "fixed2", "fixed3"]
    table = trace_table(
        arm=[a for a in arms for _ in range(N)],
        scheduled_ns=np.tile(START_NS + np.arange(N) * 10**9, 3),
        ttft_s=[0.1] * 3 * N, tpot_s=[0.02] * N + [0.012] * 2 * N, e2e_s=[1.0] * 3 * N,
    )  # fmt: skip
    maps = [operating_map(request_frame(table, offered_rate=np.full(3 * N, 5.0)), [OFF, A, B], SloConfig(),
                          rate_bands([0, math.inf]))]  # fmt: skip
    helps = _ratio(1.7, 1.6, 1.8)
    same = RatioCI(point=1.0, low=0.99, high=1.01, verdict=Verdict.NO_DIFFERENCE)

    def comparison(arm: str, other: str, tpot: RatioCI) -> ArmComparison:
        verdict = Verdict.NO_DIFFERENCE if tpot.verdict is Verdict.NO_DIFFERENCE else tpot.verdict
        return ArmComparison(measure="offered_rate", band="0+", band_index=0, arm=arm, other=other, pairs=N,
                             tpot=tpot, goodput=same, verdict=verdict, decided_by="per-token latency")  # fmt: skip

    comparisons = [comparison("fixed2", "off", helps), comparison("fixed3", "off", helps),
                   comparison("fixed2", "fixed3", a_vs_b)]  # fmt: skip
    found = answer_of(maps, comparisons, VerificationReport(arms=[], switch_timings=[], passed=True), [OFF, A, B])
    (band,) = found.bands
    assert band.status == "tie" and band.best == ["fixed2", "fixed3"]
    cell = answer_section(maps, found.bands, found.lines).split('<table class="answer">')[1]
    return [band.message, cell.split("<td")[1]]


def test_an_interval_that_excludes_1_is_not_a_tie() -> None:
    message, cell = _answer(_ratio(0.94, 0.90, 0.99))
    assert "tie for best" not in message and "no difference" not in message
    assert ">not separated: fixed2, fixed3</td>" in cell  # report.html's Answer table
    # fixed3 is ahead: fixed2's per-token ratio 0.94 [0.90, 0.99] inverted is [1.01, 1.11]
    assert (
        "fixed2, fixed3 lead, not separated beyond the margin (fixed2 vs fixed3 per-token 0.94x [0.90, 0.99], "
        "fixed3 ahead by 1.0-11%: not shown beyond the 2% margin (n=60))" in message
    )


@pytest.mark.parametrize(("low", "high"), [(0.97, 1.03), (0.99, 1.0)])
def test_an_interval_that_includes_1_is_a_tie(low: float, high: float) -> None:
    message, cell = _answer(_ratio(1.0, low, high))
    assert ">tie: fixed2, fixed3</td>" in cell
    assert f"fixed2, fixed3 tie for best (fixed2 vs fixed3 per-token 1.00x [{low:.2f}, {high:.2f}], no difference" in (
        message
    )
