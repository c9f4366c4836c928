"""Executed-policy verification: planted faults are caught, correct arms pass, switch times are measured."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from loadshapes.shapes import CrossAndRecover
from loadshapes.trace import FILE_SCHEMA, TraceWriter
from orchestrator.analysis.opmap.results import ArmVerification, VerificationReport
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import request_frame
from orchestrator.analysis.read.telemetry import arm_telemetry
from orchestrator.analysis.read.views import run_requests
from orchestrator.analysis.verify.executed import verify_executed_policy
from orchestrator.analysis.verify.recovery import Reference, binned_runs, switch_timings
from orchestrator.analysis.verify.settings import VerifySettings
from serve_apps.policies import DynamicPolicy, FixedPolicy, OffPolicy, Topology
from tests import REPO
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table

SCHEDULE = ((1, 64, 3), (65, 128, 1), (129, 512, 0))
DYNAMIC = DynamicPolicy(method="ngram", max_k=3, schedule=SCHEDULE)
SINGLE = ArmInfo.from_policy("dyn", DYNAMIC)
DP = ArmInfo.from_policy("dyn-dp", DYNAMIC, topology=Topology(kind="data_parallel", size=2))
OFF = ArmInfo.from_policy("off", OffPolicy())
FIXED = ArmInfo.from_policy("fixed", FixedPolicy(method="ngram", k=3))
ALL_ZERO = ArmInfo.from_policy("dyn-k0", DynamicPolicy(method="ngram", max_k=3, schedule=((1, 512, 0),)))
CONFIG = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": SCHEDULE})
DROPPED = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": None})
BATCHES = [[4, 10, 40], [60, 70, 100], [120, 150, 300], [8, 90, 200]]  # every schedule range, several times


def _k(batch: int, table: np.ndarray) -> int:
    return int(table[batch])


def step_rows(
    arm: ArmInfo, *, executed: Any, config: str | None = CONFIG, dropped: bool = False
) -> dict[str, list[Any]]:
    """One request per batch list; `executed(batch)` is the k each step ran."""
    rows: dict[str, list[Any]] = {k: [] for k in ("arm", "scheduled_ns", "step_batch_size", "step_k",
                                                  "per_step_drafted", "resolved_speculative_config",
                                                  "schedule_dropped")}  # fmt: skip
    for i, batches in enumerate(BATCHES * 5):
        ks = [executed(b) for b in batches]
        rows["arm"].append(arm.name)
        rows["scheduled_ns"].append(START_NS + i * 10**9)
        rows["step_batch_size"].append(batches)
        rows["step_k"].append(ks)
        rows["per_step_drafted"].append([k for k in ks if k > 0])
        rows["resolved_speculative_config"].append(config)
        rows["schedule_dropped"].append(dropped)
    return rows


def _verify(arm: ArmInfo, **kwargs: Any) -> ArmVerification:
    report = verify_executed_policy(trace_table(**step_rows(arm, **kwargs)), [arm])
    (result,) = report.arms
    return result


def _finding(result: ArmVerification, check: str) -> tuple[bool, str]:
    (finding,) = [f for f in result.findings if f.check == check]
    return finding.passed, finding.message


def test_a_correct_dynamic_arm_passes_every_check() -> None:
    table = SINGLE.k_table()
    result = _verify(SINGLE, executed=lambda b: _k(b, table))
    assert result.passed and result.match_fraction == 1.0
    assert {f.check for f in result.findings} == {
        "identity", "executed_k", "schedule_dropped", "static_fallback", "schedule_switched"
    }  # fmt: skip
    bands = {b.band: b for b in result.bands}
    assert bands["65-128"].configured_k == [1] and bands["65-128"].executed_k == {"1": 1.0}
    assert bands["129-256"].configured_k == [0] and bands["1-8"].mean_executed_k == 3.0
    assert (
        _finding(result, "schedule_switched")[1]
        == "dyn: executed k took {0, 1, 3} over batch sizes 4-300 (configured {0, 1, 3})"
    )


def test_the_data_parallel_fallback_is_caught() -> None:
    result = _verify(DP, executed=lambda b: 3, config=DROPPED, dropped=True)
    assert not result.passed
    passed, message = _finding(result, "schedule_dropped")
    assert not passed and "schedule_dropped on 20 of 20 requests" in message and "data parallelism" in message
    passed, message = _finding(result, "static_fallback")
    assert not passed
    assert message == (
        "dyn-dp: ran the static max k = 3 in 100.0% of the 35 steps where the schedule gives less: "
        "vLLM's data-parallel fallback (topology data_parallel2)"
    )
    passed, message = _finding(result, "executed_k")
    assert not passed and "worst band 65-128: configured {1}, executed k=3 100.0%" in message
    assert {b.band: b.passed for b in result.bands} == {
        "1-8": True, "9-32": True, "33-64": True, "65-128": False, "129-256": False, "257-512": False
    }  # fmt: skip


def test_the_resolved_config_alone_shows_a_dropped_schedule() -> None:
    result = _verify(DP, executed=lambda b: 3, config=DROPPED, dropped=False)
    passed, message = _finding(result, "schedule_dropped")
    assert not passed and "resolved config has no num_speculative_tokens_per_batch_size" in message


def test_a_schedule_that_never_switched_is_caught() -> None:
    result = _verify(SINGLE, executed=lambda b: 1)
    assert not result.passed
    passed, message = _finding(result, "schedule_switched")
    assert not passed
    assert message == (
        "dyn: the schedule never switched: executed k = 1 in all 60 steps although batch sizes 4-300 "
        "configure k = {0, 1, 3}"
    )
    assert _finding(result, "static_fallback")[0]  # stuck at 1, not at the static max k
    stuck_at_max = _verify(SINGLE, executed=lambda b: 3)
    passed, message = _finding(stuck_at_max, "static_fallback")
    assert not passed and message.endswith("the schedule was not applied")


def test_off_and_dynamic_with_k0_are_told_apart() -> None:
    off = _verify(OFF, executed=lambda b: 0, config=None)
    assert off.passed
    assert _finding(off, "identity")[1] == "off: really off: no speculative config, k = 0 in all 60 steps, no drafts"
    k0 = _verify(ALL_ZERO, executed=lambda b: 0)
    # its schedule has one k at every batch size: no load could make it switch, so nothing is "not exercised";
    # it ran k as configured and passes
    assert k0.passed and k0.status == "pass"
    message = _finding(k0, "identity")[1]
    assert message == "dyn-k0: dynamic, not off: the engine reports its speculative config; k = 0 in 100.0% of steps"
    switched = "dyn-k0: nothing to switch: the schedule configures k = 0 at every batch size"
    assert _finding(k0, "schedule_switched") == (True, switched)
    ran_k3 = _verify(ALL_ZERO, executed=lambda b: 3)  # the same schedule, not followed: executed_k fails it
    assert ran_k3.failed and not _finding(ran_k3, "executed_k")[0]
    timed = verify_executed_policy(trace_table(**_cross_rows(ALL_ZERO, up_at=28.0, down_at=59.0)), [ALL_ZERO],
                                   shapes={"cross": CROSS})  # fmt: skip
    assert timed.switch_timings == [] and timed.passed  # no switch to time, not a switch "not exercised"
    posing_as_off = _verify(OFF, executed=lambda b: 0, config=CONFIG)
    assert not posing_as_off.passed
    assert (
        "declared off, but the engine reports a speculative config on 20 requests" in posing_as_off.findings[0].message
    )
    no_config = _verify(ALL_ZERO, executed=lambda b: 0, config=None)
    assert not no_config.passed and "it ran as off" in no_config.findings[0].message
    fixed = _verify(FIXED, executed=lambda b: 3)
    assert fixed.passed and {f.check for f in fixed.findings} == {"identity", "executed_k"}


CROSS = CrossAndRecover(
    quiet_rate=5, peak_rate=45, boundary_rate=25, quiet_s=20, rise_s=10, hold_s=20, fall_s=10
)  # the rate passes 25 req/s at 25 s going up and at 55 s coming down


def _cross_rows(arm: ArmInfo, *, up_at: float, down_at: float, follow: bool = True) -> dict[str, list[Any]]:
    """One single-step request every 0.1 s; the batch is high in [up_at, down_at) and k follows it (or not)."""
    table = arm.k_table()
    times = np.arange(0, 75, 0.1)
    batch = np.where((times >= up_at) & (times < down_at), 100, 10)
    ns = START_NS + np.rint(times * 1e9).astype(np.int64)
    return {
        "arm": [arm.name] * len(times),
        "shape": ["cross"] * len(times),
        "scheduled_ns": ns,
        "server_first_scheduled_ns": ns,
        "server_done_ns": ns,
        "step_batch_size": [[int(b)] for b in batch],
        "step_k": [[int(table[b]) if follow else 3] for b in batch],
        "resolved_speculative_config": [CONFIG] * len(times),
    }


def test_switch_and_recovery_times_on_cross_and_recover() -> None:
    table = trace_table(**_cross_rows(SINGLE, up_at=28.0, down_at=59.0))
    report = verify_executed_policy(table, [SINGLE], shapes={"cross": CROSS})
    (timing,) = report.switch_timings
    assert timing.crossed_up_s == pytest.approx(25.0) and timing.crossed_down_s == pytest.approx(55.0)
    assert timing.switch_lag_s == pytest.approx(3.0) and timing.recovery_s == pytest.approx(4.0)
    assert (timing.quiet_k, timing.loaded_k, timing.passed) == (3, 1, True)
    assert timing.message == (
        "dyn on cross (run r1, repeat 0): k 3 -> 1 3.0 s after the load crossed up at 25.0 s, back to 3 4.0 s "
        "after it came down at 55.0 s (bound 10 s): pass"
    )
    tight = verify_executed_policy(table, [SINGLE], shapes={"cross": CROSS}, settings=VerifySettings(switch_bound_s=2))
    assert not tight.switch_timings[0].passed and not tight.passed
    by_batch = verify_executed_policy(
        table, [SINGLE], shapes={"cross": CROSS}, settings=VerifySettings(reference="batch")
    ).switch_timings[0]
    # Against the telemetry's own crossing (the batch passing 64), a correct engine switches at once.
    assert (by_batch.crossed_up_s, by_batch.switch_lag_s, by_batch.recovery_s) == (28.0, 0.0, 0.0)
    report_json = json.loads(report.model_dump_json())
    assert VerificationReport.model_validate(report_json) == report


def test_a_schedule_that_never_switches_fails_the_timing() -> None:
    table = trace_table(**_cross_rows(SINGLE, up_at=28.0, down_at=59.0, follow=False))
    (timing,) = verify_executed_policy(table, [SINGLE], shapes={"cross": CROSS}).switch_timings
    assert not timing.passed and timing.switch_lag_s is None
    assert timing.message.endswith("executed k never changed from 3 after the load crossed up at 25.0 s")
    quiet = trace_table(**_cross_rows(SINGLE, up_at=80.0, down_at=90.0))
    (timing,) = verify_executed_policy(quiet, [SINGLE], shapes={"cross": CROSS}).switch_timings
    assert not timing.passed and timing.status == "not_exercised" and "not exercised" in timing.message


def test_a_switch_never_asked_for_by_most_steps_is_not_exercised_and_says_how_many_steps_were_there() -> None:
    """Every third step in the loaded stretch runs at a batch size whose k is 1: no time bin is mostly there, so
    there is no switch to time. That is not a pass, and the line counts the steps the per-band checks show."""
    rows = _cross_rows(SINGLE, up_at=28.0, down_at=59.0)
    table = SINGLE.k_table()
    batches = [b if b[0] == 10 or i % 3 == 0 else [10] for i, b in enumerate(rows["step_batch_size"])]
    rows.update(step_batch_size=batches, step_k=[[int(table[b[0]])] for b in batches])
    report = verify_executed_policy(trace_table(**rows), [SINGLE], shapes={"cross": CROSS})
    (timing,) = report.switch_timings
    loaded = sum(b[0] == 100 for b in batches)
    assert (timing.status, timing.passed) == ("not_exercised", False)
    assert timing.message == (
        f"dyn on cross (run r1, repeat 0): not exercised: {loaded} of {len(batches)} steps ran at batch sizes whose "
        "k is other than 3 (batch max 100), but in no 1 s bin most of them: no switch to time"
    )
    (arm,) = report.arms
    high = [b for b in arm.bands if 1 in b.configured_k]
    assert sum(b.steps for b in high) == loaded  # the per-band lines count the same steps
    assert report.status == "not_exercised" and not report.passed
    assert VerificationReport.model_validate(json.loads(report.model_dump_json())) == report


def test_steps_without_a_k_are_left_out_and_reported() -> None:
    table = SINGLE.k_table()
    rows = step_rows(SINGLE, executed=lambda b: _k(b, table))
    rows["step_k"][0] = rows["step_k"][0][:1]  # the engine reported fewer k than batch sizes
    (result,) = verify_executed_policy(trace_table(**rows), [SINGLE]).arms
    assert result.passed and result.steps == 58
    assert _finding(result, "telemetry")[1] == (
        "1 requests report step_k and step_batch_size of different lengths; only their common steps were checked"
    )


# --- endpoint arms (foreign servers): per_step_drafted + /metrics samples -------------------------------------
EP_SCHEDULE = ((1, 2, 4), (3, 6, 2), (7, 16, 1))
EP_POLICY = DynamicPolicy(method="draft_model", model="d", max_k=4, schedule=EP_SCHEDULE)


def _endpoint_case(
    arm: ArmInfo, running: int, drafted: int, *, counters_off_by: int = 0, old_run: Path | None = None
) -> VerificationReport:
    """30 requests each drafting `drafted` tokens in 5 steps while the server reports `running` requests; the
    server's counters move by exactly the trace's totals (plus `counters_off_by` drafts). `old_run`: the samples go
    through a samples file there in the format written before the dialects (no generation_tokens, draft_length)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.rundir.endpoint_samples import SCHEMA, read_samples, unit_path

    n = 30
    steps = 5 if drafted else 0  # vLLM omits steps without drafts from per_step_drafted
    table = trace_table(
        arm=[arm.name] * n,
        scheduled_ns=[START_NS + i * 10**8 for i in range(n)],
        first_token_ns=[START_NS + i * 10**8 + 10**7 for i in range(n)],
        done_ns=[START_NS + i * 10**8 + 5 * 10**8 for i in range(n)],
        per_step_drafted=[[drafted] * steps] * n,
        per_step_accepted=[[1] * steps] * n,
    )
    times = [START_NS - 10**8 + i * 3 * 10**8 for i in range(14)]
    total = n * steps
    samples = pa.table(
        {
            "time_ns": times, "running": [float(running)] * 14, "waiting": [0.0] * 14, "engines": [1] * 14,
            "num_drafts": [100.0] + [100.0 + total + counters_off_by] * 13,
            "draft_tokens": [400.0] + [400.0 + total * drafted] * 13,
            "accepted_tokens": [50.0] + [50.0 + total] * 13,
            "generation_tokens": [None] * 14, "draft_length": [None] * 14,  # vLLM exports neither
        },
        schema=SCHEMA,
    ).append_column("arm", pa.array([arm.name] * 14)).append_column("shape", pa.array(["s"] * 14)).append_column(
        "repeat", pa.array([0] * 14, pa.int32())
    )  # fmt: skip
    if old_run is not None:
        path = Path(unit_path(str(old_run), arm.name, "s", 0))
        path.parent.mkdir(parents=True)
        pq.write_table(samples.select(OLD_SAMPLE_COLUMNS), path)
        samples = read_samples(str(old_run), [(arm.name, "s", 0)])
    return verify_executed_policy(table, [arm], endpoint_samples=samples)


# The samples file's columns before the dialects (vLLM's three counters only)
OLD_SAMPLE_COLUMNS = ["time_ns", "running", "waiting", "engines", "num_drafts", "draft_tokens", "accepted_tokens"]


def test_an_endpoint_run_written_before_the_dialects_verifies_as_it_did(tmp_path: Path) -> None:
    arm = ArmInfo.from_policy("dyn-single", EP_POLICY, max_num_seqs=16)
    for drafted, off_by in ((2, 0), (2, 3)):
        now = _endpoint_case(arm, running=4, drafted=drafted, counters_off_by=off_by)
        old = _endpoint_case(arm, running=4, drafted=drafted, counters_off_by=off_by, old_run=tmp_path / f"r{off_by}")
        assert old == now
        assert {f.check: f.status for f in old.arms[0].findings}["reconciliation"] == ("fail" if off_by else "pass")


def test_an_endpoint_arm_following_its_schedule_passes_with_evidence_and_reconciles() -> None:
    arm = ArmInfo.from_policy("dyn-single", EP_POLICY, max_num_seqs=16)
    (result,) = _endpoint_case(arm, running=4, drafted=2).arms
    status = {f.check: f.status for f in result.findings}
    assert status["executed_k"] == "pass" and result.steps == 150
    assert status["static_fallback"] == "pass" and status["reconciliation"] == "pass"
    assert status["schedule_dropped"] == "not_verifiable"  # a foreign server reports no resolved config
    approximation = next(f for f in result.findings if f.check == "endpoint_approximation")
    assert "exact for a draft-model" in approximation.message and "running-requests gauge" in approximation.message
    assert not result.failed and not result.passed  # not every check had evidence


def test_an_endpoint_arm_on_data_parallel_is_caught_running_max_k() -> None:
    arm = ArmInfo.from_policy("dyn-dp2", EP_POLICY, topology=Topology(kind="data_parallel", size=2), max_num_seqs=16)
    (result,) = _endpoint_case(arm, running=4, drafted=4).arms
    fallback = next(f for f in result.findings if f.check == "static_fallback")
    assert fallback.status == "fail" and "data-parallel fallback" in fallback.message


def test_an_endpoint_without_drafts_is_not_verifiable_and_counters_that_disagree_fail() -> None:
    off = ArmInfo.from_policy("off-single", OffPolicy(), max_num_seqs=16)
    (result,) = _endpoint_case(off, running=4, drafted=0).arms
    status = {f.check: f.status for f in result.findings}
    assert status["executed_k"] == "not_verifiable" and not result.failed
    arm = ArmInfo.from_policy("dyn-single", EP_POLICY, max_num_seqs=16)
    (wrong,) = _endpoint_case(arm, running=4, drafted=2, counters_off_by=3).arms
    reconciliation = next(f for f in wrong.findings if f.check == "reconciliation")
    assert reconciliation.status == "fail" and "num_drafts delta" in reconciliation.message


def _gate(checked: ArmVerification, not_verifiable: str) -> tuple[bool, str]:

    from orchestrator.analysis.gates import evaluate_gates
    from orchestrator.plan.campaign import load_campaign

    campaign = load_campaign(REPO / "campaigns" / "quickstart.yaml")
    campaign = campaign.model_copy(
        update={"gates": campaign.gates.model_copy(update={"not_verifiable": not_verifiable})}
    )
    arm = ArmInfo.from_policy(checked.arm, EP_POLICY, max_num_seqs=16)
    report = VerificationReport(arms=[checked], switch_timings=[], passed=checked.passed)
    (gate,) = [g for g in evaluate_gates(campaign, [arm], report, []) if g.gate == "dynamic_follows_schedule"]
    return gate.passed, gate.message


def test_an_endpoint_dynamic_arm_is_gated_on_fallback_and_switch_not_on_gauge_estimated_batch_sizes() -> None:
    from orchestrator.analysis.opmap.results import Finding

    def checked(fallback_passes: bool) -> ArmVerification:
        findings = [
            Finding.not_verifiable("executed_k", "ep", "ep: not verifiable step by step: 65% at the sampled batch"),
            Finding(check="endpoint_approximation", arm="ep", passed=True, message="ep: batch size from /metrics"),
            Finding.not_verifiable("schedule_dropped", "ep", "ep: not verifiable from config"),
            Finding(check="static_fallback", arm="ep", passed=fallback_passes, message="ep: fallback check"),
            Finding(check="schedule_switched", arm="ep", passed=True, message="ep: executed k took 1, 2, 4"),
        ]
        return ArmVerification(arm="ep", kind="dynamic", topology="single", steps=900, match_fraction=0.65,
                               bands=[], findings=findings, passed=False)  # fmt: skip

    passed, message = _gate(checked(True), "report")
    # 65% step-by-step match is below min_follow_fraction, yet the schedule demonstrably ran: the gate says so
    assert passed and "judged by static_fallback and schedule_switched" in message and "sampled /metrics" in message
    assert "not verifiable: executed_k, schedule_dropped" in message
    assert not _gate(checked(True), "fail")[0]  # the campaign asked for evidence on every check
    assert not _gate(checked(False), "report")[0]  # a static fallback fails it whatever the gauge says
    # a specdrill arm (no endpoint_approximation) keeps the step-by-step fraction
    exact = checked(True).model_copy(
        update={"findings": [f for f in checked(True).findings if f.check != "endpoint_approximation"]}
    )
    assert not _gate(exact, "report")[0]


def test_the_console_report_tells_not_verifiable_from_failed() -> None:
    import io

    from rich.console import Console

    from orchestrator.analysis.opmap.results import Finding
    from orchestrator.analysis.summary import Summary
    from orchestrator.report.build import print_report

    unverified = ArmVerification(
        arm="off-single", kind="off", topology="single", steps=0, match_fraction=None, bands=[], passed=False,
        findings=[Finding.not_verifiable("executed_k", "off-single", "off-single: not verifiable: no drafting steps")],
    )  # fmt: skip
    failed = unverified.model_copy(
        update={
            "arm": "dyn-dp2",
            "findings": [Finding(check="static_fallback", arm="dyn-dp2", passed=False, message="dyn-dp2: ran k=[4]")],
        }
    )
    summary = Summary(
        campaign="c", run="r", mode="virtual", generated="now", units=[], maps=[], gates=[], headline=[],
        verification=VerificationReport(arms=[unverified, failed], switch_timings=[], passed=False),
        saturated_units=[], incomplete_units=[], fault_windows=[], passed=True,
    )  # fmt: skip
    out = io.StringIO()
    print_report(summary, Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "NOT VERIFIABLE off-single" in text and "[not verifiable] off-single: not verifiable" in text
    assert "FAIL dyn-dp2" in text and "[fail] dyn-dp2: ran k=[4]" in text  # brackets in a message survive
    # The arm's line says what its status rests on: the share of steps at the configured k, and, where that is
    # all there is, which check had no evidence (never "k as configured in 100%" beside NOT EXERCISED unexplained)
    exercised = ArmVerification(
        arm="dyn", kind="dynamic", topology="single", steps=60, match_fraction=1.0, bands=[], passed=False,
        findings=[Finding(check="executed_k", arm="dyn", passed=True, message="dyn: executed k = configured k"),
                  Finding.not_exercised("schedule_switched", "dyn", "dyn: not exercised: 1-4 all configure k = 3")],
    )  # fmt: skip
    out = io.StringIO()
    only = summary.model_copy(update={"verification": VerificationReport(arms=[exercised], switch_timings=[],
                                                                         passed=False)})  # fmt: skip
    print_report(only, Console(file=out, width=200, color_system=None))
    assert (
        "NOT EXERCISED dyn (dynamic, single): executed k = configured k on 100.0% of steps; schedule_switched not "
        "exercised"
    ) in out.getvalue()


# --- the fast paths: telemetry from the Parquet footers, switch timing from binned counts --------------------
def _write_unit(root: Path, table: pa.Table, *, row_group: int) -> None:
    """One part file per (arm, shape, repeat), `row_group` rows per row group, as a load worker's flushes would."""
    keys = zip(table["arm"].to_pylist(), table["shape"].to_pylist(), table["repeat"].to_pylist(), strict=True)
    for arm, shape, repeat in sorted(set(keys)):
        mask = pc.and_(pc.and_(pc.equal(table["arm"], arm), pc.equal(table["shape"], shape)),
                       pc.equal(table["repeat"], repeat))  # fmt: skip
        rows = table.filter(mask).select(FILE_SCHEMA.names).cast(FILE_SCHEMA)
        directory = root / "traces" / f"arm={quote(arm, safe='')}" / f"shape={quote(shape, safe='')}"
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, directory / f"part-{arm}-r{repeat}.parquet", row_group_size=row_group)


def _set(rows: dict[str, list[Any]], column: str, values: Sequence[Any]) -> dict[str, list[Any]]:
    return {**rows, column: list(values)}


def _findings(report: VerificationReport) -> list[tuple[str, str, bool, str]]:
    return [(a.arm, f.check, f.passed, f.message) for a in report.arms for f in a.findings]


def test_telemetry_from_the_footers_equals_the_rows_scan(tmp_path: Path) -> None:
    """20 requests per arm in row groups of 5 whose config, schedule_dropped and drafts vary between row groups
    (decided by the statistics) or within one (read from the rows); a partial unit whose rows would change every
    finding; the same findings as the table in memory, which has no footers."""
    table_k = SINGLE.k_table()
    by_group = [CONFIG] * 5 + [DROPPED] * 5 + [None, CONFIG, None, CONFIG, None] + [None] * 5
    arms = {
        # off: no config, no drafts: every statistic pins it
        "off": step_rows(OFF, executed=lambda b: 0, config=None),
        # a config per row group (and NULLs within one), schedule_dropped true / false / NULL by row group
        "dyn": _set(
            _set(step_rows(SINGLE, executed=lambda b: _k(b, table_k)), "resolved_speculative_config", by_group),
            "schedule_dropped",
            [True] * 5 + [False] * 5 + [None] * 10,
        ),
        # the data-parallel fallback: the dropped config everywhere, schedule_dropped in two row groups
        "dyn-dp": _set(
            step_rows(DP, executed=lambda b: 3, config=DROPPED), "schedule_dropped", [False] * 10 + [True] * 10
        ),
        # two configs within one row group: its statistics decide nothing, the arm's rows are read
        "fixed": _set(
            step_rows(FIXED, executed=lambda b: 3), "resolved_speculative_config", [CONFIG, DROPPED] * 2 + [CONFIG] * 16
        ),
        # NULL drafted_tokens with per-step lists: the drafts come from the lists, read from the rows
        "dyn-k0": _set(
            _set(step_rows(ALL_ZERO, executed=lambda b: 0, config=None), "drafted_tokens", [None] * 20),
            "per_step_drafted",
            [[2, 2]] * 20,
        ),
    }
    off_drafting = ArmInfo.from_policy("off-drafts", OffPolicy())
    arms["off-drafts"] = _set(
        step_rows(off_drafting, executed=lambda b: 0, config=None), "drafted_tokens", [0] * 15 + [7] * 5
    )
    infos = [OFF, SINGLE, DP, FIXED, ALL_ZERO, off_drafting]
    columns: dict[str, list[Any]] = {}
    for name, rows in arms.items():
        rows.setdefault("drafted_tokens", [sum(d) for d in rows["per_step_drafted"]])
        for column, values in rows.items():
            columns.setdefault(column, []).extend(name if column == "arm" else v for v in values)
    n = len(columns["arm"])
    columns["request_id"] = [f"{a}:s:0:{i % 20}" for i, a in enumerate(columns["arm"])]
    complete = trace_table(**columns)
    # A partial unit (repeat 1) of off with a config, drops and drafts: not evidence, so not counted.
    partial = trace_table(
        **{**step_rows(OFF, executed=lambda b: 3, dropped=True), "drafted_tokens": [99] * 20},
        request_id=[f"off:s:1:{i}" for i in range(20)],
    )
    _write_unit(tmp_path, pa.concat_tables([complete, partial]), row_group=5)
    units = [(a.name, "s", 0) for a in infos]
    from_files = run_requests(str(tmp_path), units)
    in_memory = request_frame(complete)
    try:
        footers = arm_telemetry(from_files, infos)
        scanned = arm_telemetry(in_memory, infos)
        assert [t.from_footers for t in footers] == [True, True, True, False, False, False]
        assert not any(t.from_footers for t in scanned)
        for a, b in zip(footers, scanned, strict=True):
            assert (a.rows, a.config_rows, a.dropped_rows, a.schedule_in_config, a.drafted) == (
                b.rows, b.config_rows, b.dropped_rows, b.schedule_in_config, b.drafted
            )  # fmt: skip
        assert footers[1].dropped_rows == 5 and footers[1].config_rows == 12 and footers[1].schedule_in_config
        assert footers[5].drafted_tokens == 35  # counted: an off arm's failure says how many
        report = verify_executed_policy(from_files, infos)
        assert _findings(report) == _findings(verify_executed_policy(in_memory, infos))
        assert "35 draft tokens were verified" in report.arms[5].findings[0].message
        assert n == 120 and len(from_files) == 120
    finally:
        from_files.close()
        in_memory.close()


def _timeline(root: Path, arm: ArmInfo, shape: str, times: np.ndarray, batch: np.ndarray, k: np.ndarray) -> None:
    directory = root / "timelines" / f"arm={arm.name}" / f"shape={shape}"
    directory.mkdir(parents=True, exist_ok=True)
    ns = START_NS + np.rint(times * 1e9).astype(np.int64)
    steps = pa.table(
        {
            "engine_id": [f"{arm.name}-0"] * len(times),
            "start_ns": ns,
            "end_ns": ns + 10**7,
            "batch_size": pa.array(batch, pa.int32()),
            "k": pa.array(k, pa.int32()),
        }
    )
    pq.write_table(steps, directory / "r0.parquet")


def test_a_normal_run_directory_is_verified_without_reading_a_trace_row(tmp_path: Path) -> None:
    """Part files as the load worker writes them (one writer per unit) and engine step timelines: telemetry
    from the footers, steps and switch timing from the timelines. With every read of `trace` made an error, the
    same report."""
    table_k = SINGLE.k_table()
    writers = {}
    for arm in (SINGLE, OFF):
        for shape in ("cross", "s"):
            rows = _cross_rows(arm, up_at=28.0, down_at=59.0)
            rows["shape"] = [shape] * len(rows["arm"])
            rows["unit_start_ns"] = [START_NS] * len(rows["arm"])
            rows["request_id"] = [f"{arm.name}:{shape}:0:{i}" for i in range(len(rows["arm"]))]
            if arm is OFF:
                rows["resolved_speculative_config"] = [None] * len(rows["arm"])
                rows["step_k"] = [[0] for _ in rows["step_k"]]
            table = trace_table(**rows)
            writers[(arm.name, shape)] = TraceWriter(str(tmp_path / "traces"), writer_id=f"{arm.name}-{shape}-r0-w")
            for row in table.to_pylist():
                writers[(arm.name, shape)].append(row)
            times = np.arange(0, 75, 0.05)
            batch = np.where((times >= 28.0) & (times < 59.0), 100, 10)
            executed = table_k[batch] if arm is SINGLE else np.zeros(len(times), np.int64)
            _timeline(tmp_path, arm, shape, times, batch, executed)
    for writer in writers.values():
        writer.close()
    units = [(a, s, 0) for a, s in writers]
    shapes = {"cross": CROSS}
    expected = verify_executed_policy(run_requests(str(tmp_path), units), [SINGLE, OFF], shapes=shapes)
    requests = run_requests(str(tmp_path), units)
    try:
        assert requests.step_arms == {"dyn", "off"}
        assert all(t.from_footers for t in arm_telemetry(requests, [SINGLE, OFF]))
        trace_sql = requests.con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'trace'").fetchone()
        assert trace_sql is not None
        body = str(trace_sql[0]).split(" AS ", 1)[1].rstrip(";")
        requests.con.execute(
            f"CREATE OR REPLACE TEMP VIEW trace AS SELECT * FROM ({body}) WHERE error('a trace row was read') IS NULL"
        )
        with pytest.raises(duckdb.InvalidInputException, match="a trace row was read"):
            requests.con.execute("SELECT count(*) FROM trace").fetchall()
        report = verify_executed_policy(requests, [SINGLE, OFF], shapes=shapes)
    finally:
        requests.close()
    assert report == expected and report.passed
    (timing,) = report.switch_timings
    assert (timing.quiet_k, timing.loaded_k, timing.switch_lag_s, timing.recovery_s) == (3, 1, 3.0, 4.0)


def _per_step_timing(
    arm: ArmInfo, run: tuple[str, str, str, int], shape: CrossAndRecover, time_s: np.ndarray, batch: np.ndarray,
    executed: np.ndarray, reference: str, bin_s: float, bound_s: float,
) -> dict[str, Any]:  # fmt: skip
    """The switch timing as it was computed before the binned counts, step by step (the oracle)."""

    def mode(values: np.ndarray) -> int | None:
        return int(np.bincount(values).argmax()) if len(values) else None

    def bin_modes(bins: np.ndarray, values: np.ndarray, n_bins: int) -> np.ndarray:
        width = int(values.max()) + 1
        counts = np.bincount(bins * width + values, minlength=n_bins * width).reshape(n_bins, width)
        modes: np.ndarray = np.where(counts.sum(axis=1) > 0, counts.argmax(axis=1), -1)
        return modes

    def first_bin(condition: np.ndarray, start: int) -> int | None:
        hits = np.flatnonzero(condition[start:])
        return int(start + hits[0]) if len(hits) else None

    batch = np.clip(batch, 0, arm.max_num_seqs)
    configured = arm.k_table()[batch]
    _, shape_name, run_name, repeat = run
    where = f"{arm.name} on {shape_name} (run {run_name}, repeat {repeat})"
    up_shape, down_shape = shape.crossing_offsets()
    usable = np.isfinite(time_s) & (time_s >= 0)
    time_s, batch, executed, configured = time_s[usable], batch[usable], executed[usable], configured[usable]
    bins = (time_s / bin_s).astype(np.int64)
    n_bins = int(bins.max()) + 1 if len(bins) else 0
    before = time_s < up_shape
    quiet_k, quiet_configured = mode(executed[before]), mode(configured[before])
    out: dict[str, Any] = dict.fromkeys(
        ("crossed_up_s", "switched_s", "switch_lag_s", "crossed_down_s", "recovered_s", "recovery_s", "loaded_k")
    )
    out.update(arm=arm.name, shape=shape_name, run=run_name, repeat=repeat, reference=reference, quiet_k=quiet_k,
               bound_s=bound_s)  # fmt: skip

    def result(passed: bool, message: str, status: str | None = None, **values: Any) -> dict[str, Any]:
        status = status or ("pass" if passed else "fail")
        return {**out, **values, "passed": passed, "status": status, "message": f"{where}: {message}"}

    if quiet_k is None or quiet_configured is None:
        return result(False, f"no engine steps before the load crossed up at {up_shape:.1f} s: cannot time a switch")
    configured_modes = bin_modes(bins, configured, n_bins)
    executed_modes = bin_modes(bins, executed, n_bins)
    loaded = (configured_modes >= 0) & (configured_modes != quiet_configured)
    if not loaded.any():
        other = int((configured != quiet_configured).sum())
        reached = (
            f"the batch (max {int(batch.max())}) never reached a schedule range with k other than {quiet_configured}"
            if other == 0
            else f"{other} of {len(configured)} steps ran at batch sizes whose k is other than {quiet_configured} "
            f"(batch max {int(batch.max())}), but in no {bin_s:g} s bin most of them"
        )
        return result(False, f"not exercised: {reached}: no switch to time", "not_exercised")
    if reference == "shape":
        up, down = up_shape, down_shape
    else:
        loaded_bins = np.flatnonzero(loaded)
        up, down = float(loaded_bins[0] * bin_s), float((loaded_bins[-1] + 1) * bin_s)
    loaded_k = mode(executed[(time_s >= up) & (time_s < down)])
    switched_bin = first_bin((executed_modes >= 0) & (executed_modes != quiet_k), int(up // bin_s))
    if switched_bin is None:
        return result(False, f"executed k never changed from {quiet_k} after the load crossed up at {up:.1f} s",
                      crossed_up_s=up, crossed_down_s=down, loaded_k=loaded_k)  # fmt: skip
    switched = max(switched_bin * bin_s, up)
    recovered_bin = first_bin(executed_modes == quiet_k, max(int(down // bin_s), switched_bin + 1))
    lag = switched - up
    if recovered_bin is None:
        return result(
            False,
            f"k {quiet_k} -> {executed_modes[switched_bin]} {lag:.1f} s after the load crossed up at {up:.1f} s, "
            f"never back to {quiet_k} after it came down at {down:.1f} s",
            crossed_up_s=up, switched_s=switched, switch_lag_s=lag, crossed_down_s=down, loaded_k=loaded_k,
        )  # fmt: skip
    recovered = max(recovered_bin * bin_s, down)
    recovery = recovered - down
    passed = lag <= bound_s and recovery <= bound_s
    return result(
        passed,
        f"k {quiet_k} -> {executed_modes[switched_bin]} {lag:.1f} s after the load crossed up at {up:.1f} s, back to "
        f"{quiet_k} {recovery:.1f} s after it came down at {down:.1f} s (bound {bound_s:g} s): "
        f"{'pass' if passed else 'FAIL'}",
        crossed_up_s=up, switched_s=switched, switch_lag_s=lag, crossed_down_s=down, recovered_s=recovered,
        recovery_s=recovery, loaded_k=loaded_k,
    )  # fmt: skip


# An up crossing at an awkward time (not a multiple of any bin): 20.3 + 9.7 * 20 / 40 = 25.15 s.
ODD_CROSS = CrossAndRecover(quiet_rate=5, peak_rate=45, boundary_rate=25, quiet_s=20.3, rise_s=9.7, hold_s=19.9,
                            fall_s=10.1)  # fmt: skip


def _random_run(rng: np.random.Generator, shape: CrossAndRecover, bin_s: float) -> tuple[np.ndarray, ...]:
    """A run's steps: a few per bin (so modes tie often), the batch high over a random stretch around the
    shape's crossings, k following the schedule late, early, never or noisily; times on and next to bin edges
    and crossings, and some unusable (NaN, negative)."""
    up, down = shape.crossing_offsets()
    span = down + 20 + rng.uniform(-15, 15)
    n = int(rng.integers(0, 400))
    edges = np.arange(0, span, bin_s)
    times = np.concatenate(
        [
            rng.uniform(-1, span, n),
            rng.choice(edges, 30) if len(edges) else [],
            np.nextafter(rng.choice(edges, 30), -np.inf) if len(edges) else [],
            np.nextafter(rng.choice(edges, 30), np.inf) if len(edges) else [],
            np.arange(int(span / bin_s)) * bin_s,  # i * bin_s: not always the bin's own edge (0.1 * 3 > 0.3)
            [up, down, np.nextafter(up, 0), np.nextafter(down, 0)],
            [np.nan] * int(rng.integers(0, 3)),
        ]
    )
    times = rng.permutation(times)[: int(rng.integers(0, len(times) + 1))]
    scenario = rng.choice(["cross", "cross", "late", "quiet", "stuck"])
    if scenario == "late":  # no step before the up crossing
        times = times[~(times < up)]
    high_from, high_to = up + rng.uniform(-6, 6), down + rng.uniform(-6, 6)
    if scenario == "quiet":  # the batch never reaches the next schedule range
        high_from = high_to = np.inf
    batch = np.where(
        (times >= high_from) & (times < high_to), rng.integers(65, 700, len(times)), rng.integers(0, 64, len(times))
    )
    table = SINGLE.k_table()
    lag = rng.choice([0.0, 2.0, 8.0, 30.0, np.inf])
    follows = (times >= high_from + lag) & (times < high_to + lag)
    k = np.where(follows, table[np.minimum(batch, 512)], 3)
    if scenario == "stuck":  # switched, and never back
        k = np.where(times >= high_from + lag, 1, 3)
    noisy = rng.uniform(size=len(times)) < rng.choice([0.0, 0.2, 0.45])
    k = np.where(noisy, rng.choice([0, 1, 3], len(times)), k)
    return times, batch, k


@pytest.mark.parametrize("bin_s", [1.0, 0.1, 0.3, 2.5])
@pytest.mark.parametrize("reference", ["shape", "batch"])
def test_switch_timing_from_binned_counts_equals_the_per_step_timing(bin_s: float, reference: Reference) -> None:
    rng = np.random.default_rng([int(bin_s * 10), reference == "batch"])
    con = duckdb.connect()
    shapes = {"cross": CROSS, "odd": ODD_CROSS}
    runs, parts = [], []
    for run_id in range(120):
        shape_name = ["cross", "odd"][run_id % 2]
        times, batch, k = _random_run(rng, shapes[shape_name], bin_s)
        key = ("dyn", shape_name, f"r{run_id}", run_id % 3)
        runs.append((run_id, key))
        parts.append(pa.table({"run_id": np.full(len(times), run_id), "time_s": times, "batch_size": batch, "k": k}))
    con.register("random_steps", pa.concat_tables(parts))
    # NULL times (a step whose run has no clock) are left out like NaN ones
    steps_sql = (
        "SELECT run_id, CASE WHEN time_s < -0.5 THEN NULL ELSE time_s END AS time_s, batch_size, k FROM random_steps"
    )
    binned = binned_runs(con, steps_sql, [], runs, [SINGLE], shapes, bin_s=bin_s, reference=reference)
    got = {t.run: t.model_dump() for t in switch_timings(binned, [SINGLE], shapes)}
    expected: dict[str, dict[str, Any]] = {}
    for (_, key), part in zip(runs, parts, strict=True):
        if not part.num_rows:
            continue  # no steps: no timing
        times = part["time_s"].to_numpy()
        times = np.where(times < -0.5, np.nan, times)
        expected[key[2]] = _per_step_timing(
            SINGLE, key, shapes[key[1]], times, part["batch_size"].to_numpy(), part["k"].to_numpy(), reference,
            bin_s, 10.0,
        )  # fmt: skip
    assert got == expected
    for outcome in ("cannot time a switch", "not exercised", "never changed", "never back", "(bound"):
        assert any(outcome in t["message"] for t in expected.values()), outcome  # every path of the timing
    if reference == "batch" and bin_s in (0.1, 0.3):
        assert any(b.below_start.any() or b.past_end.any() for b in binned)  # times that round across an edge


@pytest.mark.parametrize("status", ["not_exercised", "not_verifiable"])
def test_a_switch_not_exercised_fails_the_recovery_gate_only_where_checks_without_evidence_fail(status: str) -> None:

    from orchestrator.analysis.gates import evaluate_gates
    from orchestrator.analysis.opmap.results import SwitchTiming
    from orchestrator.plan.campaign import load_campaign

    timing = SwitchTiming(
        arm="dyn-single", shape="cross", run="r", repeat=0, reference="shape", crossed_up_s=None, switched_s=None,
        switch_lag_s=None, crossed_down_s=None, recovered_s=None, recovery_s=None, quiet_k=3, loaded_k=None,
        bound_s=10.0, passed=False, status=status, message="dyn-single on cross: not exercised: ...",
    )  # fmt: skip
    failed = timing.model_copy(update={"arm": "dyn-dp2", "status": "fail", "message": "dyn-dp2 on cross: never"})
    campaign = load_campaign(REPO / "campaigns" / "quickstart.yaml")

    def recovery(not_verifiable: str) -> dict[str, tuple[bool, bool, str]]:
        gates = campaign.gates.model_copy(update={"not_verifiable": not_verifiable, "max_recovery_s": 10.0})
        report = VerificationReport(arms=[], switch_timings=[timing, failed], passed=False)
        found = evaluate_gates(campaign.model_copy(update={"gates": gates}), [], report, [])
        return {g.arm or "": (g.passed, g.exempt, g.message) for g in found if g.gate == "recovery"}

    assert recovery("report") == {
        "dyn-single": (True, False, "dyn-single on cross: not exercised: ..."),
        "dyn-dp2": (True, True, "dyn-dp2 on cross: never (exempt: reported, not failed)"),  # the quickstart's exempt
    }
    assert recovery("fail")["dyn-single"] == (False, False, "dyn-single on cross: not exercised: ...")
