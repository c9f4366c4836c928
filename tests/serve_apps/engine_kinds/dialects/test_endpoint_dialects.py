"""Endpoint mode against servers that speak SGLang's and TensorRT-LLM's telemetry (servers.py beside this module):
the trace reconciles exactly with each server's counters, and what its telemetry cannot show is reported not
verifiable, in words, never passed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serve_apps.engine_kinds.dialects.endpoint_mode import endpoint_unit
from tests.serve_apps.engine_kinds.dialects.servers import SglangServer, TrtllmServer, serve

pytestmark = [pytest.mark.integration]
CROSS = {"kind": "cross_and_recover", "quiet_rate": 2, "peak_rate": 12, "boundary_rate": 6, "quiet_s": 1, "rise_s": 0.5,
         "hold_s": 1, "fall_s": 0.5}  # fmt: skip


def statuses(result: object) -> dict[str, tuple[str, str]]:
    return {f.check: (f.status, f.message) for f in result.findings if f.check != "telemetry"}  # type: ignore[attr-defined]


def test_sglang_reconciles_verify_steps_and_tokens_and_cannot_show_the_draft_length_of_a_step(tmp_path: Path) -> None:
    server = serve(SglangServer())
    try:
        result = endpoint_unit("sglang", server.url, tmp_path).arms[0]
    finally:
        server.stop()
    found = statuses(result)
    status, message = found["reconciliation"]
    assert status == "pass", message
    assert "trace totals equal the server's counter deltas over 1 units" in message
    assert " drafts, " in message and " output tokens" in message
    for check in ("executed_k",):
        assert found[check][0] == "not_verifiable"
        assert "never a step's draft length" in found[check][1]
    gauge = [f.message for f in result.findings if f.check == "telemetry" and "draft-length gauge" in f.message]
    assert not gauge or "a switch between two samples is not verifiable" in gauge[0]
    assert not result.passed and not result.failed


def test_tensorrt_llm_reconciles_output_tokens_and_its_schedule_is_never_a_pass(tmp_path: Path) -> None:
    server = serve(TrtllmServer())
    try:
        report = endpoint_unit("trtllm", server.url, tmp_path, policy="dynamic:3:1-3=3,4-512=1", shape=CROSS)
    finally:
        server.stop()
    result = report.arms[0]
    # The load crossed the schedule's boundary, but nothing the server reports can time the switch: said, per run
    (timing,) = report.switch_timings
    assert (timing.status, timing.passed, timing.switch_lag_s) == ("not_verifiable", False, None), timing
    assert "not verifiable: TensorRT-LLM reports no draft length per step" in timing.message
    found = statuses(result)
    status, message = found["reconciliation"]
    assert status == "pass", message
    assert "output tokens" in message and "measured without a per-request figure" in message
    for check in ("identity", "executed_k", "static_fallback", "schedule_switched"):
        assert found[check][0] == "not_verifiable", (check, found[check])
        assert "TensorRT-LLM reports no draft length per step" in found[check][1]
    assert not result.passed and not result.failed  # nothing per request: not "ran as off"
