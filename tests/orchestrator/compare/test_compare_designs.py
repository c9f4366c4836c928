"""`specdrill compare` on arms of the other engines' designs (SGLang's adaptive steps, TensorRT-LLM's acceptance
gate): the same requests before and after a change to one design's configuration. The changed design is named in
the set-up differences in its own terms, its verdicts move where the simulator says they must (a gate above this
drafter's acceptance shuts and speculation makes no difference; below it, it stays open and helps as a fixed k
does), and the unchanged design shows no change, request by request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.orchestrator.compare.test_compare import CHAT, compare, simulate
from tests.tiny_campaigns import EAGLE, sim_campaign

pytestmark = pytest.mark.slow  # two simulated runs of three arms (~250 requests each) and a compare


def campaign(threshold: float) -> dict[str, Any]:
    return sim_campaign("designs", **{
        "engine": {**EAGLE, "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off", "gate": f"trtllm_acceptance_gate:3:50:{threshold}", "sglang": "sglang_adaptive:3"},
        "shapes": {"climb": {"kind": "ramp", "rate_from": 2, "rate_to": 30, "duration_s": 15}},
        "mix": {"entries": [{"workload": CHAT, "weight": 1}]}, "load": {"drain_s": 10},
    })  # fmt: skip


def test_a_changed_gate_is_named_and_moves_its_verdicts_and_the_unchanged_design_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = simulate(capsys, tmp_path, "shut", campaign(0.5))  # above this drafter's acceptance: shuts
    candidate = simulate(capsys, tmp_path, "open", campaign(0.2))
    code, err, found = compare(capsys, str(base), str(candidate), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert found is not None and found.paired
    setup = {(d.what, d.arm): (d.baseline, d.candidate) for d in found.setup}
    assert setup[("policy", "gate-single")] == ("trtllm-gate-k3-w50-t0.5", "trtllm-gate-k3-w50-t0.2"), setup
    assert all(arm != "sglang-single" for _, arm in setup)
    judged = [c for c in found.cells if c.verdict != "not_comparable"]
    gate = [c for c in judged if c.arm == "gate-single"]
    sglang = [c for c in judged if c.arm == "sglang-single"]
    assert gate and sglang
    assert all(c.verdict == "better" for c in gate), [(c.band, c.verdict) for c in gate]
    assert all(c.verdict == "no_change" and c.tpot.point == pytest.approx(1.0) for c in sglang)
    changes = [v.message for v in found.verdict_changes if v.arm == "gate-single"]
    assert changes and all("made no difference" in m and "now helps" in m for m in changes), changes
    assert {v.arm for v in found.verdict_changes} == {"gate-single"}
