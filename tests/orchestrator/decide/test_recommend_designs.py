"""`specdrill recommend` on the shipped three-designs run (campaigns/three-designs.yaml): every arm of another
engine's design (SGLang's adaptive steps, TensorRT-LLM's schedule in both readings, its cap and its gate) is a
candidate in every band it has requests in, named by its design and compared with the band's fastest, beside vLLM's
k; a design never stands for a k of vLLM's schedule; where a design is faster than every vLLM k beyond the margin,
the band keeps vLLM's fastest k and says which design beat it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.decide.recommend.band import decide_band
from orchestrator.decide.recommend.runs import RunEvidence, load_evidence
from tests import REPO
from tests.shipped_runs import copy_of, shipped_run

DESIGNS = {
    "sglang-single": "SGLang sglang_adaptive",
    "sglang-s7-single": "SGLang sglang_adaptive",
    "trt-upper-single": "TensorRT-LLM trtllm_schedule",
    "trt-lower-single": "TensorRT-LLM trtllm_schedule",
    "trt-cap-single": "TensorRT-LLM trtllm_max_concurrency",
    "trt-gate-single": "TensorRT-LLM trtllm_acceptance_gate",
}

pytestmark = pytest.mark.slow  # ~15 s: the shipped campaign, 18 units in virtual time


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shipped, _ = shipped_run(tmp_path_factory, REPO / "campaigns" / "three-designs.yaml")
    # recommend writes recommendation.json into the run: a copy of the session's shared run, named as the page does
    return copy_of(shipped, tmp_path_factory.mktemp("three-designs") / "runs" / "three-designs")


def test_every_design_is_a_candidate_named_by_its_design(run: Path) -> None:
    result = CliRunner().invoke(cli, ["recommend", str(run)])
    assert result.exit_code == 0, result.output
    bands = [b for b in json.loads((run / "recommendation.json").read_text())["bands"] if b["status"] != "insufficient"]
    assert [b["band"] for b in bands] == ["1-8", "9-32", "33-76"]
    for band in bands:
        designs = {c["arm"]: c["design"] for c in band["candidates"] if c["design"] is not None}
        assert designs == DESIGNS, band["band"]
        assert band["k"] == 3 and band["arm"] == "fixed3-single"  # k = 3 is fastest, or within the margin
    top = {c["arm"]: c for c in bands[2]["candidates"]}
    # SGLang's adaptive steps at batch 33+ (mean k 0.85) against k = 3: 1.33x slower, on the same requests
    assert top["sglang-single"]["vs_best"]["point"] == pytest.approx(1.33, abs=0.02)
    # vLLM's schedule is a k again (its 33+ is k = 0), no longer hidden behind TensorRT-LLM's arm with that k
    assert {c["k"] for c in bands[2]["candidates"] if c["speculative"] and c["design"] is None} == {0, 3}
    assert "sglang-single (SGLang sglang_adaptive) 1.326x" in result.output


def test_a_design_faster_than_every_vllm_k_keeps_vllm_s_fastest_and_says_so(run: Path) -> None:
    """Without the fixed k = 3 arm, SGLang's steps (k ~3 at batch 9-32) beat vLLM's schedule (k = 1 there)."""
    evidence = load_evidence(str(run))
    choices = [
        c.model_copy(update={"candidates": [k for k in c.candidates if k.arm != "fixed3-single"]})
        for c in evidence.choices
    ]
    without: RunEvidence = dataclasses.replace(evidence, choices=choices)
    decision = decide_band([without], [choices[1]], max_k=3)
    assert decision.band == "9-32"
    assert decision.k == 1 and decision.arm == "vllm-dyn-single" and decision.confidence == "low"
    assert "is faster than every vLLM k here: k=1 is 1.3" in decision.message
    assert decision.message.split(";")[1].startswith(" sglang-single (SGLang sglang_adaptive)")
