"""engine.time_scale said and never baked in (issue 40). The quickstart (time_scale 2) played in virtual time says
what its scale means for the modelled GPU in the console, report.html and summary.json, and each figure it gives
holds against a twin run at time_scale 1 with the rates doubled and the durations halved. calibrate on it, started
from a distant base profile, returns the shipped profile's costs (the modelled 1x H100's, not 2x them); its fitted
profile stops at the longest k the run measured; the one-p acceptance note's bounds hold against the generating
profile."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.analysis.read.time_scale import time_scale_of
from orchestrator.plan.campaign import Campaign
from serve_apps.sim.profile import load_profile
from tests import REPO
from tests.orchestrator.calibrate.distant import distant_base, step_costs

BIN = Path(sys.executable).parent / "specdrill"
QUICKSTART = REPO / "campaigns" / "quickstart.yaml"
UNIT_LINE = re.compile(r"arm=(\S+) shape=(\S+) .* tpot_p50=([\d.]+)ms")


def _quickstart() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    return data


def _simulate(campaign: Path, out: Path) -> str:
    done = subprocess.run([str(BIN), "simulate", str(campaign), "--output", str(out)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode in (0, 3), done.stderr[-2000:]  # 3: a gate failed (the quickstart's exempt arm is not)
    return done.stdout


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path, str]:
    """The quickstart in virtual time, then calibrated from the distant base: (run, console, fitted, calibrate's
    output)."""
    tmp = tmp_path_factory.mktemp("quickstart")
    run = tmp / "run"
    console = _simulate(QUICKSTART, run)
    fitted = tmp / "fitted.yaml"
    done = subprocess.run([str(BIN), "calibrate", str(run), "--base", str(distant_base(tmp)), "-o", str(fitted)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return run, console, fitted, done.stdout


def test_a_slowed_run_says_what_its_scale_means_and_each_figure_holds(
    played: tuple[Path, str, Path, str], tmp_path: Path
) -> None:
    run, console, _, _ = played
    campaign = _quickstart()
    scale = campaign["engine"]["time_scale"]
    assert scale != 1
    summary = json.loads((run / "summary.json").read_text())
    said = summary["time_scale"]
    line = said["line"]
    assert said["scale"] == scale and said["hardware"] == load_profile(campaign["engine"]["profile"]).hardware
    assert line in console  # the console, before any number
    assert console.index(line[:60]) < console.index("answer")
    assert html.escape(line) in (run / "report.html").read_text()
    assert line in summary["headline"]
    # the figures, against the campaign: its highest rate and its slo's deadlines, converted by the scale
    assert line.startswith(f"time_scale {scale:g}: every engine step takes {scale:g}x the profile's time")
    peak = max(v for shape in campaign["shapes"].values() for k, v in shape.items() if k.endswith("rate")
               or k in ("rate_from", "rate_to"))  # fmt: skip
    here, there = (float(x) for x in re.search(r"([\d.]+) req/s here is ~([\d.]+) req/s", line).groups())  # type: ignore[union-attr]
    assert here == pytest.approx(peak, rel=0.02) and there == pytest.approx(peak * scale, rel=0.02)
    slo = campaign["slo"]
    tpot, ttft = slo["tpot_s"] * 1e3, slo["ttft_s"] * 1e3
    converted = f"TPOT {tpot:g} ms and TTFT {ttft:g} ms here are {tpot / scale:g} ms and {ttft / scale:g} ms on"
    assert converted in line
    assert f"its latencies are {scale:g}x that GPU's" in line

    # The twin: time_scale 1, rates x scale, durations / scale (off and fixed3 only): the same load on the model, so
    # each unit's per-token latency is 1/scale of the slowed run's, and a run at scale 1 says nothing of a scale.
    twin = _quickstart()
    twin["engine"]["time_scale"] = 1.0
    for shape in twin["shapes"].values():
        for key, value in list(shape.items()):
            if key.endswith("rate") or key in ("rate_from", "rate_to"):
                shape[key] = value * scale
            elif key.endswith("_s"):
                shape[key] = value / scale
    twin["arms"] = [{"policy": "off", "topology": "single"}, {"policy": "fixed3", "topology": "single"}]
    twin["gates"] = {}
    path = tmp_path / "twin.yaml"
    path.write_text(yaml.safe_dump(twin))
    twin_console = _simulate(path, tmp_path / "twin")
    slowed = {(m[1], m[2]): float(m[3]) for m in UNIT_LINE.finditer(console)}
    unslowed = {(m[1], m[2]): float(m[3]) for m in UNIT_LINE.finditer(twin_console)}
    assert len(unslowed) == 6
    for key, tpot in unslowed.items():
        assert slowed[key] == pytest.approx(tpot * scale, rel=0.03), key
    assert json.loads((tmp_path / "twin" / "summary.json").read_text())["time_scale"] is None
    assert "time_scale" not in twin_console


def test_calibrate_fits_the_modelled_hardwares_own_seconds(played: tuple[Path, str, Path, str]) -> None:
    _, _, fitted_path, out = played
    truth, fitted = load_profile("llama3.1-8b-h100-eagle"), load_profile(str(fitted_path))
    for name, (want, got) in step_costs(truth, fitted).items():
        assert got == pytest.approx(want, rel=0.05), name
    assert "engine.time_scale 2: its steps took 2x the hardware's time; divided by 2" in out
    # the prediction check replays the run at its own scale: off's per-token latency predicted as measured
    off = next(line for line in out.splitlines() if line.startswith("  arm off-single, every offered rate"))
    assert float(off.split("tpot p50 ")[1].split(",")[0]) == pytest.approx(1.0, abs=0.02), off


def test_the_fitted_profile_stops_at_the_measured_k_and_its_note_holds(
    played: tuple[Path, str, Path, str],
) -> None:
    _, _, fitted_path, out = played
    campaign = _quickstart()
    measured = max(int(p.split(":")[1]) for p in campaign["policies"].values() if p != "off")
    fitted, truth = load_profile(str(fitted_path)), load_profile("llama3.1-8b-h100-eagle")
    assert fitted.limits.max_draft_tokens == measured == 3
    assert f"limits.max_draft_tokens {measured} (the base's: 8)" in out

    def oracle(profile: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN), "simulate", "oracle", "--profile", profile, "--workload", "chat",
                               "--tolerance", "0.02", "--batch-sizes", "1,16,64,128", "--json", *extra],
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    refused = oracle(str(fitted_path), "--max-k", str(measured + 1))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "limits.max_draft_tokens 3" in refused.stderr
    capped = json.loads(oracle(str(fitted_path)).stdout)
    assert capped["max_k"] == measured
    # The note's claim, against the generating profile: one p for every position has position 1 at or above p and
    # position k at or below it; so the fitted oracle's k is never shorter than the truth's at a batch size.
    p = fitted.acceptance["chat"].per_position
    assert len(p) == 1
    chat = truth.acceptance["chat"].per_position
    assert chat[0] >= p[0] >= chat[-1]
    assert f"position 1 at or above {p[0]:.3f} and position {measured} at or below it" in out
    want = json.loads(oracle("llama3.1-8b-h100-eagle", "--max-k", str(measured)).stdout)
    for got_point, want_point in zip(capped["points"], want["points"], strict=True):
        assert got_point["best_k"] >= want_point["best_k"], (got_point["batch_size"], got_point, want_point)


def _campaign(**engine: object) -> Campaign:
    data = _quickstart()
    data["engine"].update(engine)
    return Campaign.model_validate(data)


def test_the_time_scale_line_on_hard_cases(tmp_path: Path) -> None:
    assert time_scale_of(_campaign(time_scale=1.0), mode="virtual", peak_rate=12.0) is None
    fast = time_scale_of(_campaign(time_scale=0.5), mode="virtual", peak_rate=12.0)
    assert fast is not None and "at 2x its speed: its latencies are 0.5x that GPU's" in fast.line
    assert "12 req/s here is ~6 req/s" in fast.line
    assert "TPOT 30 ms and TTFT 1000 ms here are 60 ms and 2000 ms" in fast.line
    # a closed-loop run has no offered rate; a campaign without deadlines has none to convert; real time says the
    # host's own delays are not slowed
    data = _quickstart()
    data["slo"] = {"ttft_s": None, "tpot_s": None}
    closed = time_scale_of(Campaign.model_validate(data), mode="real", peak_rate=None)
    assert closed is not None
    assert "req/s" not in closed.line and "deadlines" not in closed.line
    assert closed.line.endswith("in real time the host's own delays (HTTP, Ray) are not slowed, only the engine's "
                                "steps")  # fmt: skip
    # a loaded campaign keeps the profile it was loaded with (its file is read once per load): a file gone since
    # changes nothing; an engine whose profile file cannot be read: named, not its hardware
    fitted = tmp_path / "fitted.yaml"
    fitted.write_text((REPO / "serve_apps" / "profiles" / "llama3.1-8b-h100-eagle.yaml").read_text())
    campaign = _campaign(profile=str(fitted))
    fitted.unlink()
    kept = time_scale_of(campaign, mode="virtual", peak_rate=None)
    assert kept is not None and kept.hardware == "1x H100 80GB SXM"
    missing = tmp_path / "missing.yaml"
    engine = campaign.engine.model_copy(update={"profile": str(missing)})  # another profile: its file is read
    gone = time_scale_of(campaign.model_copy(update={"engine": engine}), mode="virtual", peak_rate=None)
    assert gone is not None and gone.hardware is None and f"profile {missing}'s hardware" in gone.line
