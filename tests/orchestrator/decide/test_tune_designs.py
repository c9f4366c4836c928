"""`specdrill tune CAMPAIGN --design D` on the shipped EAGLE profile and three-designs' traffic (one seed, max k 4):
each design's best configuration from a space projected from the oracle, its per-band speedup over `off`, the
oracle's own schedule played on the same requests beside it, and per band which design wins. The designs that
can express a per-batch table (vLLM's and TensorRT-LLM's schedules, SGLang's slots) reach the oracle's figure."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.decide.tune.designs import DESIGNS, DesignsResult, tune_designs
from orchestrator.decide.tune.designs_words import words
from orchestrator.plan.campaign import load_campaign
from serve_apps.sim.profile import load_profile
from tests import REPO

CAMPAIGN = REPO / "campaigns" / "three-designs.yaml"
pytestmark = pytest.mark.slow  # ~18 s: every design's space played on the traffic, the command, and on DP


@pytest.fixture(scope="module")
def result() -> DesignsResult:
    campaign = load_campaign(str(CAMPAIGN))
    return tune_designs(campaign, load_profile("llama3.1-8b-h100-eagle"), DESIGNS, seeds=1, max_k=4)


def test_each_design_s_best_beside_the_oracle(result: DesignsResult) -> None:
    best = {b.design: b for b in result.best}
    assert list(best) == list(DESIGNS)
    assert result.oracle_schedule[0] == [1, 15, 4]  # the oracle's k at small batches: 4 (max k)
    # vLLM's schedule searched from the oracle's is the oracle's: the same figures on the same requests
    assert best["vllm_schedule"].speedups == result.oracle_speedups
    for design in ("vllm_schedule", "trtllm_schedule", "sglang_adaptive"):
        for found, truth in zip(best[design].speedups, result.oracle_speedups, strict=True):
            assert found is not None and truth is not None
            assert found >= 0.97 * truth, (design, best[design].policy, found, truth)
    # SGLang reaches it with one candidate per slot: its EMA with several does not hold k above what it accepts
    assert best["sglang_adaptive"].policy.startswith("sglang_adaptive:4 slots 1:[4],8:[4],32:[3]")
    assert all(s is not None and s > 1.5 for b in result.best for s in b.speedups)


def test_the_answer_names_each_band_s_winner(result: DesignsResult) -> None:
    lines = words(result)
    assert any(line.startswith("  oracle (best k per batch") for line in lines)
    per_band = [line for line in lines if " req/s: " in line]
    assert len(per_band) == len(result.bands) == 6
    assert all(("wins" in line or "tie within 2%" in line) and "over off" in line for line in per_band)


def test_the_command() -> None:
    """As the engineering note shows it: every design, one seed, max k 4."""
    args = ["tune", str(CAMPAIGN), "--design", "all", "--seeds", "1", "--max-k", "4"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert "  trtllm_schedule: trtllm_schedule:upper_bounds:4:15=4,63=3,255=2,512=1 (2 tried): " in out.output
    assert sum(line.startswith(f"  {d}: ") for d in DESIGNS for line in out.output.splitlines()) == len(DESIGNS)


def test_on_a_data_parallel_group_vllm_and_sglang_answer_a_static_k(result: DesignsResult) -> None:
    """--topology data_parallel:2, two seeds: vLLM's schedule and SGLang's adaptive steps do not run on a DP group
    (their engines fall back to a static k), so their best there is a static k named with its fallback, searched
    over the static k, where on one engine it is a schedule; TensorRT-LLM's, with no fallback modelled, stays a
    schedule; every figure carries its interval over the two seeds; the oracle's schedule runs on replicas:2."""
    one_engine = {b.design: b.policy for b in result.best}
    assert one_engine["vllm_schedule"] == "dynamic:4:1-15=4,16-63=3,64-255=2,256-512=1"
    assert one_engine["sglang_adaptive"].startswith("sglang_adaptive:4 slots 1:[4],8:[4],32:[3]")
    args = ["tune", str(CAMPAIGN), "--design", "vllm_schedule", "--design", "sglang_adaptive", "--design",
            "trtllm_schedule", "--seeds", "2", "--max-k", "4", "--topology", "data_parallel:2"]  # fmt: skip
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("answered for data_parallel:2 (dp2) because --topology asked for it")
    assert "in virtual time (the simulator's prediction" in lines[1] and "2 seeds of the traffic" in lines[1]
    vllm = next(line for line in lines if line.startswith("  vllm_schedule: "))
    sglang = next(line for line in lines if line.startswith("  sglang_adaptive: "))
    assert vllm.startswith("  vllm_schedule: static k = 4 (fixed:4; 4 static k tried): 1.71x [1.67, 1.75], ")
    assert sglang.startswith("  sglang_adaptive: static k = 4 (sglang_adaptive:4; 4 static k tried): ")
    said = "this design does not switch with load: its best there is static k = 4, not a schedule"
    assert any(line.startswith("    vLLM's data-parallel fallback: ") and said in line for line in lines)
    assert any(line.startswith("    SGLang's attention-DP fallback: ") and said in line for line in lines)
    trt = next(line for line in lines if line.startswith("  trtllm_schedule: "))
    assert trt.startswith("  trtllm_schedule: trtllm_schedule:upper_bounds:4:15=4,63=3,255=2,512=1 (2 tried): ")
    assert "  TensorRT-LLM's designs: no data-parallel fallback is modelled" in out.output
    assert "on replicas:2, where a schedule runs): " in out.output
    per_band = [line for line in lines if " req/s: " in line]
    assert len(per_band) == 6 and all(line.count("[") == 1 for line in per_band)  # the top's interval
    assert vllm.count("x [") == sglang.count("x [") == 6
