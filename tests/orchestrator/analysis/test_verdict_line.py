"""The verifier's one-line verdict per arm never contradicts its findings (issue 40: "FAIL dyn-dp2 (exempt) ...:
executed k = configured k on 100.0% of steps"). Hand-built step traces (test_analysis_verify's), each share
counted by hand from the batch sizes below."""

from __future__ import annotations

from typing import Any

from orchestrator.analysis.opmap.results import ArmVerification
from orchestrator.analysis.verify.executed import verify_executed_policy
from orchestrator.analysis.verify.findings import verdict_line
from orchestrator.report.html.verification import as_configured, verification_section
from tests.orchestrator.analysis.test_analysis_inputs import trace_table
from tests.orchestrator.analysis.test_analysis_verify import BATCHES, DP, DROPPED, OFF, SINGLE, step_rows


def _verify(arm: Any, rows: dict[str, list[Any]]) -> ArmVerification:
    (result,) = verify_executed_policy(trace_table(**rows), [arm]).arms
    return result


def test_a_dropped_schedule_whose_steps_all_matched_leads_with_the_drop() -> None:
    # Every step at batch 2-40, where the schedule gives k = 3, the static k vLLM runs: all 100% "match"
    rows = step_rows(DP, executed=lambda b: 3, config=DROPPED, dropped=True)
    rows["step_batch_size"] = [[2, 10, 40]] * len(rows["arm"])
    result = _verify(DP, rows)
    assert result.status == "fail" and result.match_fraction == 1.0
    line = verdict_line(result)
    assert line == (
        "schedule dropped, static k = 3 ran in 100.0% of steps (executed k = configured k on 100.0% of steps: "
        "batch sizes where the schedule gives that k too)"
    )
    assert as_configured(result) == line  # the console's and report.html's line
    assert f"{line}</td>" in verification_section(
        verify_executed_policy(trace_table(**rows), [DP]), exempt=["dyn-dp"]
    ).replace("&#x27;", "'")


def test_a_dropped_schedule_across_every_band_says_the_share_that_matched() -> None:
    result = _verify(DP, step_rows(DP, executed=lambda b: 3, config=DROPPED, dropped=True))
    # By hand: of the 12 steps in BATCHES, those at batch <= 64 (4, 10, 40, 60, 8) are where k = 3 is configured
    matched = sum(b <= 64 for batches in BATCHES for b in batches) / sum(len(b) for b in BATCHES)
    assert verdict_line(result) == (
        f"schedule dropped, static k = 3 ran in 100.0% of steps (executed k = configured k on {100 * matched:.1f}% "
        "of steps)"
    )


def test_a_schedule_that_never_switched_leads_with_that() -> None:
    result = _verify(SINGLE, step_rows(SINGLE, executed=lambda b: 1))
    table = SINGLE.k_table()
    matched = sum(int(table[b]) == 1 for batches in BATCHES for b in batches) / sum(len(b) for b in BATCHES)
    steps = 5 * sum(len(b) for b in BATCHES)
    assert verdict_line(result) == (
        f"the schedule never switched: executed k = 1 in all {steps} steps although batch sizes 4-300 configure "
        f"k = {{0, 1, 3}} (executed k = configured k on {100 * matched:.1f}% of steps)"
    )


def test_an_off_arm_that_drafted_leads_with_its_identity_and_a_passing_arm_with_its_share() -> None:
    drafted = _verify(OFF, step_rows(OFF, executed=lambda b: 3, config=None))
    assert verdict_line(drafted).startswith("declared off, but ")
    clean = _verify(SINGLE, step_rows(SINGLE, executed=lambda b: int(SINGLE.k_table()[b])))
    assert verdict_line(clean) == "executed k = configured k on 100.0% of steps"
