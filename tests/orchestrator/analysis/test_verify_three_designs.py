"""The shipped three-designs campaign (campaigns/three-designs.yaml): vLLM's schedule, SGLang's adaptive steps and
TensorRT-LLM's schedule (both key readings), concurrency cap and acceptance gate beside `off` and a fixed k, on one
ramp and one cross-and-recover shape. `specdrill simulate` passes every arm's executed-policy check, each against
its own rule; then faults are planted in the run's step timelines (a tier whose k is frozen, a gate that re-opens)
or in the policy (TensorRT-LLM's floor-0 fault turned on) and the verifier, over the same run directory, fails
naming what broke."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from orchestrator.analysis.opmap.results import ArmVerification, VerificationReport
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.views import run_requests
from orchestrator.analysis.verify.executed import verify_executed_policy
from orchestrator.cli import cli
from orchestrator.plan.campaign import Campaign, load_campaign
from tests import REPO
from tests.shipped_runs import shipped_run

CAMPAIGN = REPO / "campaigns" / "three-designs.yaml"


def _simulate(campaign: Path, out: Path) -> dict:
    result = CliRunner().invoke(cli, ["simulate", str(campaign), "--output", str(out)])
    assert result.exit_code in (0, 3), result.output  # 3: a gate failed (a planted fault)
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return shipped_run(tmp_path_factory, CAMPAIGN)  # shared with recommend's tests: read only, copied to plant


def _arms(campaign: Campaign) -> list[ArmInfo]:
    return [
        ArmInfo.from_policy(a.name, a.policy, topology=a.topology, max_num_seqs=campaign.max_num_seqs())
        for a in campaign.arms()
    ]


def _verify(run: Path, campaign: Campaign) -> VerificationReport:
    keys = [(a.name, shape, 0) for a in campaign.arms() for shape in campaign.shapes]
    requests = run_requests(str(run), keys)
    try:
        return verify_executed_policy(requests, _arms(campaign), shapes=campaign.shapes)
    finally:
        requests.close()


def _arm(report: VerificationReport, name: str) -> ArmVerification:
    return next(a for a in report.arms if a.arm == name)


def _finding(arm: ArmVerification, check: str) -> tuple[str, str]:
    found = next(f for f in arm.findings if f.check == check)
    return str(found.status), found.message


def _plant(run: Path, arm: str, change: object) -> None:
    """Rewrite the executed k of every timeline file of `arm` with `change(k) -> k`."""
    for path in sorted((run / "timelines" / f"arm={arm}").rglob("*.parquet")):
        table = pq.read_table(path)
        k = table.column("k").to_numpy(zero_copy_only=False)
        planted = pa.array(change(k), type=table.schema.field("k").type)  # type: ignore[operator]
        pq.write_table(table.set_column(table.schema.get_field_index("k"), "k", planted), path)


def test_every_design_passes_its_own_rule(shipped: tuple[Path, dict]) -> None:
    _, summary = shipped
    verification = summary["verification"]
    assert verification["passed"], [
        f["message"] for a in verification["arms"] for f in a["findings"] if not f["passed"]
    ]
    kinds = {a["kind"] for a in verification["arms"]}
    assert kinds == {"off", "fixed", "dynamic", "sglang_adaptive", "trtllm_schedule", "trtllm_max_concurrency",
                     "trtllm_acceptance_gate"}  # fmt: skip
    for arm in verification["arms"]:
        assert arm["match_fraction"] == 1.0 and all(f["status"] == "pass" for f in arm["findings"]), arm["arm"]
    messages = {f["check"]: f["message"] for a in verification["arms"] if a["arm"] == "sglang-s7-single"
                for f in a["findings"]}  # fmt: skip
    assert "replayed on its steps" in messages["executed_k"]
    # SGLang's slots 1 and 8 start at 7 and 1 and move by their EMA: the lag is warm-up 10 + interval 5 + the
    # overlap scheduler's one batch
    assert "slot 1 (1/3/5/7) first switched 16 of its batches" in messages["hysteresis_lag"]
    gate = {f["check"]: f["message"] for a in verification["arms"] if a["arm"] == "trt-gate-single"
            for f in a["findings"]}  # fmt: skip
    assert "the gate shut in 2 of 2 units" in gate["gate_stayed_shut"] and "stayed shut" in gate["gate_stayed_shut"]
    timed = {t["arm"] for t in verification["switch_timings"] if t["passed"]}
    assert timed == {"vllm-dyn-single", "sglang-single", "sglang-s7-single", "trt-upper-single", "trt-lower-single",
                     "trt-cap-single"}  # fmt: skip


def test_a_frozen_tier_fails(shipped: tuple[Path, dict], tmp_path: Path) -> None:
    run, _ = shipped
    planted = tmp_path / "run"
    shutil.copytree(run, planted)
    campaign = load_campaign(CAMPAIGN)
    assert _arm(_verify(planted, campaign), "sglang-single").passed  # the copy verifies as the run did
    _plant(planted, "sglang-single", lambda k: np.full_like(k, 3))  # a step log whose k never leaves 3
    arm = _arm(_verify(planted, campaign), "sglang-single")
    assert not arm.passed
    status, message = _finding(arm, "slots_switched")
    assert status == "fail" and "SGLang's slots never switched: executed k = {3}" in message
    status, message = _finding(arm, "executed_k")
    assert status == "fail" and "the k its rule gives (replayed on its steps) in only" in message


def test_a_gate_that_reopens_fails(shipped: tuple[Path, dict], tmp_path: Path) -> None:
    run, _ = shipped
    planted = tmp_path / "run"
    shutil.copytree(run, planted)
    campaign = load_campaign(CAMPAIGN)
    # The last tenth of each unit's steps drafts again, as a gate that re-opened would
    _plant(planted, "trt-gate-single", lambda k: np.where(np.arange(len(k)) > 0.9 * len(k), 3, k))
    arm = _arm(_verify(planted, campaign), "trt-gate-single")
    status, message = _finding(arm, "gate_stayed_shut")
    assert status == "fail" and "the gate re-opened: k > 0 in" in message
    assert not arm.passed


def test_the_floor0_fault_shows_as_a_collapse(tmp_path: Path) -> None:
    # Turned on, TensorRT-LLM's fault spoils every request that decoded through a k = 0 step; off, the same arm
    # on the same traffic accepts as many drafts afterwards as before (test_every_design_passes_its_own_rule).
    data = yaml.safe_load(CAMPAIGN.read_text())
    data["policies"]["trt-upper"] += ":floor0_fault"
    data["arms"] = [{"policy": p, "topology": "single"} for p in ("off", "fixed3", "trt-upper")]  # the rest as shipped
    faulty = tmp_path / "faulty.yaml"
    faulty.write_text(yaml.safe_dump(data))
    summary = _simulate(faulty, tmp_path / "run")
    (arm,) = [a for a in summary["verification"]["arms"] if a["arm"] == "trt-upper-single"]
    (finding,) = [f for f in arm["findings"] if f["check"] == "floor0_fault"]
    assert finding["status"] == "fail" and "acceptance collapsed after k = 0" in finding["message"]
    assert "accepted 0.0% of their" in finding["message"]
    others = [a for a in summary["verification"]["arms"] if a["arm"] != "trt-upper-single"]
    assert all(a["passed"] for a in others)
