"""Campaign files, report, gates and recommend on virtual-time runs (fast, no Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.plan.campaign import CampaignError, load_campaign
from tests.tiny_campaigns import four_arms

BASE: dict[str, Any] = four_arms(
    "t",
    shapes={
        "ramp": {"kind": "ramp", "rate_from": 2, "rate_to": 30, "duration_s": 20},
        "cross": dict(
            kind="cross_and_recover", quiet_rate=2, peak_rate=30, boundary_rate=12, quiet_s=5, rise_s=5, hold_s=10,
            fall_s=5,
        ),
    },
    mix={"entries": [{"workload": "chat", "weight": 1}]},
)


def _write(tmp_path: Path, data: dict[str, Any], name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shapes": {"q": {"kind": "quiet", "rate": 1, "duration_s": 5, "burst": 2}}}, "shapes.q.quiet.burst"),
        ({"load": {"workers": 0}}, "load.workers"),
        ({"slo": {"ttft": 1}}, "slo.ttft"),
        ({"mix": {"entries": [{"workload": "poetry", "weight": 1}]}}, "unknown workload 'poetry'"),
        ({"shapes": {"Bad Name": {"kind": "quiet", "rate": 1, "duration_s": 5}}}, "shape name 'Bad Name'"),
        ({"gates": {"min_follow_fraction": 2}}, "gates.min_follow_fraction"),
        ({"repeats": 0}, "repeats"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_every_campaign_error_names_its_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = _write(tmp_path, {**BASE, **change})
    with pytest.raises(CampaignError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_campaign(path)
    result = _cli("simulate", str(path), "--output", str(tmp_path / "run"))
    assert result.returncode == 2 and message.split(".")[0] in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # nothing started on error


def test_a_campaign_without_shapes_or_baseline_cannot_run(tmp_path: Path) -> None:
    path = _write(tmp_path, {k: v for k, v in BASE.items() if k != "shapes"})
    result = _cli("simulate", str(path), "--output", str(tmp_path / "run"))
    assert result.returncode == 2 and "shapes: a campaign needs at least one shape" in result.stderr
    path = _write(tmp_path, {**BASE, "arms": [{"policy": "dyn", "topology": "single"}]})
    result = _cli("simulate", str(path), "--output", str(tmp_path / "run"))
    assert result.returncode == 2 and "no arm runs with speculation off" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def virtual_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("virtual")
    path = _write(root, {**BASE, "output": str(root / "run")})
    result = _cli("simulate", str(path), "--no-report")
    assert result.returncode == 0, result.stderr
    return root / "run"


def test_report_fails_the_gate_on_the_data_parallel_fallback(virtual_run: Path) -> None:
    result = _cli("report", str(virtual_run))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "gate dynamic_follows_schedule failed" in result.stdout and "dyn-dp2" in result.stdout
    summary = json.loads((virtual_run / "summary.json").read_text())
    failed = [g for g in summary["gates"] if not g["passed"]]
    assert [g["arm"] for g in failed] == ["dyn-dp2"]
    assert {m["measure"] for m in summary["maps"]} == {"batch_size", "offered_rate"}
    html = (virtual_run / "report.html").read_text()
    assert "<svg" in html and "dyn-dp2" in html and "<script" not in html
    assert _cli("report", str(virtual_run), "--no-gate-exit").returncode == 0


def test_exempt_arms_are_reported_not_failed(tmp_path: Path, virtual_run: Path) -> None:
    manifest = json.loads((virtual_run / "manifest.json").read_text())
    manifest["campaign"]["gates"] = {"exempt_arms": ["dyn-dp2"]}  # gates are not part of the fingerprint
    (virtual_run / "manifest.json").write_text(json.dumps(manifest))
    try:
        result = _cli("report", str(virtual_run))
        assert result.returncode == 0, result.stdout
        assert "all gates pass" in result.stdout and "dropped the schedule" in result.stdout
    finally:
        manifest["campaign"]["gates"] = {}
        (virtual_run / "manifest.json").write_text(json.dumps(manifest))


def test_recommend_builds_a_valid_vllm_schedule_and_a_rehearsal(virtual_run: Path) -> None:
    result = _cli("recommend", str(virtual_run))
    assert result.returncode == 0, result.stderr
    recommendation = json.loads((virtual_run / "recommendation.json").read_text())
    candidates = [c for b in recommendation["bands"] for c in b["candidates"]]
    assert candidates and "dyn-dp2" not in {c["arm"] for c in candidates}  # it did not run its policy
    for band in recommendation["bands"]:  # the evidence behind each choice: n, ratio, interval, a word
        assert band["confidence"] in {"high", "medium", "low", "none"} and band["message"].startswith(band["band"])
        if band["k"] is not None:
            assert band["k"] in {c["k"] for c in band["candidates"] if c["speculative"]}
        for c in band["candidates"]:
            assert c["requests"] >= 20 and (c["vs_best"] is None or c["vs_best"]["point"] is not None)
    if recommendation["speculative_config"] is not None:
        from serve_apps.policies import validate_schedule

        validate_schedule([tuple(e) for e in recommendation["schedule"]])
        assert "num_speculative_tokens_per_batch_size" in result.stdout
    rehearsal = load_campaign(virtual_run / "recommended-campaign.yaml")
    names = [a.name for a in rehearsal.arms()]
    assert "dyn-dp2" not in names and "off-single" in names
    assert rehearsal.output is not None and rehearsal.output.endswith("-recommended")


def test_report_of_a_missing_run_is_one_line() -> None:
    result = _cli("report", "/nonexistent/run")
    assert result.returncode == 2 and "/nonexistent/run: no such directory" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_unreachable_endpoint_is_a_clear_error_at_start(tmp_path: Path) -> None:
    from tests.ray_helpers import free_port

    campaign = {
        "name": "ep",
        "engine": {"kind": "endpoint", "model": "m", "urls": {"off-single": f"http://127.0.0.1:{free_port()}"}},
        "policies": {"off": "off"},
        "shapes": {"q": {"kind": "quiet", "rate": 1, "duration_s": 2}},
        "output": str(tmp_path / "run"),
    }
    result = _cli("run", str(_write(tmp_path, campaign)))
    assert result.returncode != 0 and "engine.urls.off-single" in result.stderr and "unreachable" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    missing = {**campaign, "engine": {**campaign["engine"], "urls": {"other": "http://127.0.0.1:1"}}}
    with pytest.raises(CampaignError, match=r"engine\.urls: no URL for arm off-single"):
        load_campaign(_write(tmp_path, missing, "m.yaml"))


def test_recommend_reads_the_reports_aggregates(virtual_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.analysis import summary
    from orchestrator.analysis.read.inputs import load_run

    assert _cli("report", str(virtual_run), "--no-gate-exit").returncode == 0
    inputs = load_run(str(virtual_run))
    written = json.loads((virtual_run / "summary.json").read_text())
    del written["evidence"]  # its seal (orchestrator/rundir/evidence.py), not a Summary field

    def analyse_again(*_: object, **__: object) -> object:
        raise AssertionError("the trace was analysed a second time")

    monkeypatch.setattr(summary, "build_summary", analyse_again)
    assert summary.summary_for(inputs).model_dump(mode="json") == written
    # A summary of other units (the run was resumed since) is not reused.
    stale = inputs.__class__(**{**inputs.__dict__, "units": inputs.units[:-1]})
    with pytest.raises(AssertionError, match="analysed a second time"):
        summary.summary_for(stale)


def test_an_off_arm_that_drafted_fails_a_default_gate_and_voids_its_speedups(virtual_run: Path) -> None:
    # The manifest says fixed3's traces came from an `off` arm (and off's from fixed k = 3): a baseline that drafted
    manifest = json.loads((virtual_run / "manifest.json").read_text())
    original = json.dumps(manifest)
    manifest["campaign"]["policies"] = {**BASE["policies"], "off": "fixed:3", "fixed3": "off"}
    (virtual_run / "manifest.json").write_text(json.dumps(manifest))
    try:
        result = _cli("report", str(virtual_run))
        assert result.returncode == 3, result.stdout + result.stderr
        summary = json.loads((virtual_run / "summary.json").read_text())
        gate = next(g for g in summary["gates"] if g["gate"] == "baseline_is_off")
        assert not gate["passed"] and gate["arm"] == "fixed3-single"
        assert gate["message"].startswith("fixed3-single: declared off, but ")
        assert gate["message"].endswith(
            "every speedup measured against fixed3-single (dyn-dp2, dyn-single, off-single) is void"
        )
        assert "gate baseline_is_off failed" in result.stdout and "all gates pass" not in result.stdout
    finally:
        (virtual_run / "manifest.json").write_text(original)
