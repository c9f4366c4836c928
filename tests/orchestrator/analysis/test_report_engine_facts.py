"""The report on two arms whose vLLM engine facts differ, one of them with its max_model_len lowered to the
drafter's: the facts in report.html's arms table, the lowering as a warning line and the differences as confounds,
in the console and report.html (orchestrator/analysis/headline.py engine_confounds)."""

from __future__ import annotations

from html import escape as html_escape
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.plan.campaign import Campaign
from orchestrator.report.build import write_report
from orchestrator.rundir.layout import MANIFEST
from orchestrator.rundir.manifest import arm_entry
from orchestrator.virtual.campaign import simulate_campaign
from tests.tiny_campaigns import sim_campaign

# vLLM 0.33's warning (config/vllm.py 0.33:3043-3050), as it reads after formatting
LOWERED = (
    "The draft model's max_model_len (2048) is smaller than the target model's (8192) and the V2 model runner "
    "can't skip speculation for longer sequences; reducing max_model_len to 2048."
)


def _telemetry(vllm: str, runner: str, executor: str, async_on: bool, length: int, lowered: str | None) -> dict:
    """What a vLLM replica's /specdrill/info reports (serve_apps/service.py info, engines/base.py engine_facts)."""
    return {
        "engine_kind": "vllm", "vllm_version": vllm, "cudagraph_mode": "FULL_AND_PIECEWISE", "model_runner": runner,
        "executor": executor, "async_scheduling": async_on, "max_model_len": length, "max_model_len_requested": 8192,
        "max_model_len_lowered_reason": lowered, "schedule_dropped": False, "schedule_dropped_reason": None,
        "engine_ids": {"0": "e0"}, "versions": {"engine": f"vllm/{vllm}"},
    }  # fmt: skip


def test_a_lowered_max_model_len_and_engines_that_differ_are_said(tmp_path: Path) -> None:
    campaign = Campaign.model_validate(sim_campaign(
        "facts", policies={"off": "off", "fixed3": "fixed:3"}, output=str(tmp_path / "facts"),
        shapes={"quiet": {"kind": "quiet", "rate": 2, "duration_s": 4}}, warmup={"requests": 0},
    ))  # fmt: skip
    store, _ = simulate_campaign(campaign)
    # The real runner writes each arm's entry from its replica's telemetry (execute/ray_executor.py warmed_entry).
    manifest: dict[str, Any] = store.read_json(MANIFEST, "the manifest")
    facts = {
        "off-single": _telemetry("0.33.0", "V2", "uni", True, 8192, None),
        "fixed3-single": _telemetry("0.34.0", "V2", "mp", True, 2048, LOWERED),
    }
    for arm in campaign.arms():
        manifest["arms"][arm.name] = arm_entry(arm, manifest["arms"][arm.name]["url"], facts[arm.name])
    store.write_json(MANIFEST, manifest)

    console = Console(width=400, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    summary = write_report(store.root, console=console)
    text = console.export_text()
    html = (Path(store.root) / "report.html").read_text()
    warning = f"arm fixed3-single: vLLM lowered max_model_len from 8192 to 2048: {LOWERED}"
    confounds = [
        "vLLM versions differ between arms (fixed3-single 0.34.0, off-single 0.33.0): part of their difference is "
        "the vLLM version, not k",
        "executors differ between arms (fixed3-single mp, off-single uni): part of their difference is the "
        "executor, not k",
        "max_model_len differs between arms (fixed3-single 2048, off-single 8192): part of their difference is the "
        "context limit, not k",
    ]
    for line in [warning, *confounds]:
        assert line in summary.headline and line in text
        assert html_escape(line) in html
    # Facts the arms share (model runner V2, async scheduling on, the graph mode) are not confounds.
    assert not any(line.startswith(("model runners", "async scheduling", "CUDA graph")) for line in summary.headline)
    # report.html's arms table: each arm's engine facts in one cell.
    assert "vLLM 0.34.0, V2, executor mp, async on, max_model_len 2048 (lowered from 8192)" in html
    assert "vLLM 0.33.0, V2, executor uni, async on, max_model_len 8192" in html
