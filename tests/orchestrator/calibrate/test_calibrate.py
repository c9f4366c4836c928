"""specdrill calibrate against what generated the data: virtual-time runs of a known profile (the shipped EAGLE
one, and one with a planted k-switch cost) must give that profile back, and runs that cannot identify a
coefficient are refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.analysis.read.inputs import load_run
from orchestrator.analysis.steps.arm_steps import BLOCK_STEPS, timeline_files, timeline_steps
from orchestrator.analysis.steps.kswitch_cost import k_switch_lines
from serve_apps.sim.profile import load_profile
from tests import REPO
from tests.orchestrator.calibrate.distant import distant_base, step_costs

BIN = Path(sys.executable).parent / "specdrill"
SHIPPED = "llama3.1-8b-h100-eagle"

CAMPAIGN = """
name: calrec
engine: {{kind: simulated, profile: {profile}}}
policies:
  "off": "off"
  fixed1: "fixed:1"
  fixed3: "fixed:3"
  dyn: "dynamic:3:1-8=3,9-24=1,25-512=0"
topologies: {{single: single}}
arms:
{arms}
shapes:
  ramp: {{kind: ramp, rate_from: 1, rate_to: 30, duration_s: 20}}
load: {{store_step_lists: true}}
mix:
  entries: [{{workload: chat, weight: 2}}, {{workload: editing, weight: 1}}]
"""
ALL_ARMS = ["off", "fixed1", "fixed3", "dyn"]


def _run(tmp_path: Path, profile: str, arms: list[str], name: str = "run") -> Path:
    text = CAMPAIGN.format(
        profile=profile, arms="\n".join(f'  - {{policy: "{a}", topology: single}}' for a in arms)
    )
    campaign = tmp_path / f"{name}.yaml"
    campaign.write_text(text)
    out = tmp_path / name
    done = subprocess.run([str(BIN), "simulate", str(campaign), "--output", str(out), "--no-report"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), "calibrate", *args], capture_output=True, text=True, timeout=300)


def test_the_shipped_profile_is_recovered_from_its_own_runs(tmp_path: Path) -> None:
    run = _run(tmp_path, SHIPPED, ALL_ARMS)
    fitted_path = tmp_path / "fitted.yaml"
    # from a base far from the truth (every cost x3, every acceptance 0.3): a fit that kept its base fails below
    done = _calibrate(str(run), "--base", str(distant_base(tmp_path)), "-o", str(fitted_path))
    assert done.returncode == 0, done.stderr[-2000:]
    truth, fitted = load_profile(SHIPPED), load_profile(str(fitted_path))
    for name, (want, got) in step_costs(truth, fitted).items():
        assert got == pytest.approx(want, rel=0.05), name
    for category in ("chat", "editing"):
        want_p = truth.acceptance[category].per_position
        got_p = fitted.acceptance[category].per_position
        assert len(got_p) == len(want_p)
        assert max(abs(a - b) for a, b in zip(want_p, got_p, strict=True)) <= 0.03, category
    assert fitted.provenance is not None and fitted.provenance.steps > 0
    assert "verify.fixed + step_overhead" in done.stdout  # said to be one sum
    assert "R^2" in done.stdout
    # the prediction check: the run replayed on the fitted profile, every arm and band, speedups against off
    check = [line for line in done.stdout.splitlines() if line.startswith("  arm ")]
    assert "in-sample: no repeat was held out" in done.stdout
    cells = [line for line in check if "tpot p50" in line]
    assert {line.split(",")[0] for line in cells} == {f"  arm {a}-single" for a in ALL_ARMS}
    for line in cells:  # the generating profile predicts its own runs; what is left is the acceptance draws'
        ratios = [float(part.rsplit(" ", 1)[1]) for part in line.split(": ", 1)[1].split(", ")]
        assert all(abs(r - 1) < 0.1 for r in ratios), line
    speedups = [line for line in check if "speedup measured" in line and "every offered rate" in line]
    assert [line.split(" vs ")[0] for line in speedups] == ["  arm fixed1-single", "  arm fixed3-single"]
    for line in speedups:
        points = float(line.rsplit("(", 1)[1].split(" ")[0])
        assert abs(points) < 5, line
    # without a planted switch cost the excess after a change of k is ~0
    assert fitted.k_switch_cost_s == pytest.approx(0.0, abs=2e-5)

    # the fitted profile is usable where a shipped one is
    command = [str(BIN), "simulate", "oracle", "--profile", str(fitted_path), "--workload", "chat",
               "--batch-sizes", "1,8,64", "--json"]  # fmt: skip
    oracle = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert oracle.returncode == 0, oracle.stderr[-2000:]
    assert json.loads(oracle.stdout)
    # and tune searches on it (issue 27: "works with a fitted profile"), its rehearsal campaign on the same one
    tuned = subprocess.run([str(BIN), "tune", str(tmp_path / "run.yaml"), "--profile", str(fitted_path), "--seeds",
                            "1", "--budget", "12", "-o", str(tmp_path / "tune")],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    searched_line = next(line for line in tuned.stdout.splitlines() if line.startswith("searched "))
    assert " candidate schedules " in searched_line, tuned.stdout
    searched = int(searched_line.split()[1])
    assert 2 <= searched <= 12
    rehearsal = yaml.safe_load((tmp_path / "tune" / "rehearsal-campaign.yaml").read_text())
    assert Path(rehearsal["engine"]["profile"]).resolve() == fitted_path.resolve()


def test_a_planted_k_switch_cost_is_found(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "serve_apps" / "profiles" /
                           f"{SHIPPED}.yaml").read_text())  # fmt: skip
    data["name"] = "planted"
    data["k_switch_cost_s"] = 0.004
    planted = tmp_path / "planted.yaml"
    planted.write_text(yaml.safe_dump(data))
    run = _run(tmp_path, str(planted), ["off", "fixed1", "fixed3", "dyn"])
    fitted_path = tmp_path / "fitted.yaml"
    done = _calibrate(str(run), "-o", str(fitted_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert load_profile(str(fitted_path)).k_switch_cost_s == pytest.approx(0.004, rel=0.25)
    assert "k-switch cost +4." in done.stdout or "k-switch cost +3." in done.stdout

    # the report's verification section says it too, per dynamic arm, with its interval
    report = subprocess.run([str(BIN), "report", str(run), "--no-gate-exit"], capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stderr[-2000:]
    line = next(x for x in report.stdout.splitlines() if "k-switch cost" in x).strip()
    value, low, high, n = _k_switch(line)
    assert line.startswith("arm dyn-single: k-switch cost +")
    assert line.endswith("switches (excess step time against this run's step fit)")
    assert value == pytest.approx(4.0, rel=0.25) and low <= value <= high and n >= 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verification"]["k_switch_costs"] == [line]
    assert "<h3>k-switch cost</h3>" in (run / "report.html").read_text()

    # A run longer than the report's fit holds is fitted on an even sample of blocks of its steps (the memory stays
    # flat): the planted cost is still found, and the line says on how many steps.
    inputs = load_run(str(run))
    total = sum(timeline_steps(inputs, files) for files in timeline_files(inputs).values())
    budget = total // 3
    every = -(-total // budget)  # 3 or 4: the budget rounds down
    sampled = k_switch_lines(inputs, max_steps=budget)
    assert len(sampled) == 1, sampled
    value, low, high, n = _k_switch(sampled[0])
    assert value == pytest.approx(4.0, rel=0.25) and low <= value <= high and 2 <= n < _k_switch(line)[3]
    held = int(sampled[0].split("fitted on ")[1].split(" of ")[0].replace(",", ""))
    assert total // (every + 1) < held <= budget + 2 * BLOCK_STEPS
    assert sampled[0].endswith(f"fitted on {held:,} of its {total:,} steps, one block of 1,000 consecutive steps "
                               f"in {every})")  # fmt: skip


def _k_switch(line: str) -> tuple[float, float, float, int]:
    """'... k-switch cost +4.012 ms per switch [+3.9, +4.1] over 12 switches ...' -> (4.012, 3.9, 4.1, 12)"""
    value = float(line.split("k-switch cost ")[1].split(" ms")[0])
    low, high = (float(x) for x in line.split("[")[1].split("]")[0].split(", "))
    n = int(line.split(" over ")[1].split(" ")[0])
    return value, low, high, n


def test_a_run_of_off_arms_only_is_refused_in_one_line(tmp_path: Path) -> None:
    run = _run(tmp_path, SHIPPED, ["off"])
    done = _calibrate(str(run), "-o", str(tmp_path / "fitted.yaml"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "draft" in lines[0], done.stderr
    assert not (tmp_path / "fitted.yaml").exists()


def test_vllms_dynamic_profile_is_imported(tmp_path: Path) -> None:
    # a file in the format of vLLM PR #32374, written from a known profile's cost model
    truth = load_profile(SHIPPED)
    context = 1024
    stats: dict[str, dict[str, float]] = {}
    for batch in (1, 4, 16, 64):
        stats[str(batch)] = {}
        for k in range(0, 4):
            kv = batch * context
            seconds = (truth.verify.per_kv_token * kv + truth.verify.per_batched_token * batch * (k + 1)
                       + truth.verify.fixed + truth.step_overhead)  # fmt: skip
            if k:
                seconds += truth.draft.per_kv_token * kv + truth.draft.per_draft_token * k + truth.draft.fixed
            stats[str(batch)][str(k)] = seconds * 1e3
    rates, alive = [], 1.0
    for p in truth.acceptance["chat"].per_position:
        alive *= p
        rates.append(alive)
    path = tmp_path / "vllm-profile.json"
    path.write_text(json.dumps({"max_num_speculative_tokens": 3, "acceptance_rate_per_pos": rates,
                                "batch_stats": stats}))  # fmt: skip
    out = tmp_path / "fitted.yaml"
    done = _calibrate("--from-vllm-profile", str(path), "--base", SHIPPED, "--context-tokens", str(context),
                      "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    fitted = load_profile(str(out))
    assert fitted.verify.per_kv_token == pytest.approx(truth.verify.per_kv_token, rel=0.05)
    assert fitted.verify.per_batched_token == pytest.approx(truth.verify.per_batched_token, rel=0.05)
    assert fitted.draft.fixed == pytest.approx(truth.draft.fixed, rel=0.05)
    assert fitted.acceptance["chat"].per_position == pytest.approx(truth.acceptance["chat"].per_position, abs=1e-9)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    bad = _calibrate("--from-vllm-profile", str(broken), "--base", SHIPPED, "-o", str(tmp_path / "x.yaml"))
    assert bad.returncode == 2 and str(broken) in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    # a directory given for the file: one line too (it was a traceback until 2026-12-05)
    folder = _calibrate("--from-vllm-profile", str(tmp_path), "--base", SHIPPED, "-o", str(tmp_path / "x.yaml"))
    assert folder.returncode == 2 and folder.stderr.strip() == f"specdrill: error: {tmp_path}: cannot be read " \
        "(IsADirectoryError)"  # fmt: skip
    assert not (tmp_path / "x.yaml").exists()


def _profile_with(tmp_path: Path, name: str, **verify: float) -> Path:
    data = yaml.safe_load((REPO / "serve_apps" / "profiles" /
                           f"{SHIPPED}.yaml").read_text())  # fmt: skip
    data["name"] = name
    data["verify"].update(verify)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_engines_that_differ_get_separate_fits_and_alike_ones_one_pooled_fit(tmp_path: Path) -> None:
    truth = load_profile(SHIPPED)
    slower = _profile_with(tmp_path, "slower", per_batched_token=truth.verify.per_batched_token * 2,
                           fixed=truth.verify.fixed * 1.5)  # fmt: skip
    shipped = _run(tmp_path, SHIPPED, ALL_ARMS, name="shipped")
    other = _run(tmp_path, str(slower), ALL_ARMS, name="other")
    out = tmp_path / "fitted.yaml"
    done = _calibrate(str(shipped), str(other), "-o", str(out), "--no-check")
    assert done.returncode == 0, done.stderr[-2000:]
    assert " differ: a separate fit per run" in done.stdout
    assert "  verify.per_batched_token: " in done.stdout and "  verify.fixed + step_overhead: " in done.stdout
    assert f"not written: {out}" in done.stdout and not out.exists()
    written = [load_profile(str(p)) for p in tmp_path.glob("fitted.*.yaml")]
    assert len(written) == 2
    run_ids = {key: json.loads((run / "manifest.json").read_text())["run"] for key, run in
               (("shipped", shipped), ("other", other))}  # fmt: skip
    by_truth = {key: next(p for p in written if p.provenance and p.provenance.runs == [run_id])
                for key, run_id in run_ids.items()}  # fmt: skip
    want = {"shipped": truth, "other": load_profile(str(slower))}
    for key, fitted in by_truth.items():
        w = want[key]
        assert fitted.verify.per_batched_token == pytest.approx(w.verify.per_batched_token, rel=0.05), key
        assert fitted.verify.fixed + fitted.step_overhead == pytest.approx(w.verify.fixed + w.step_overhead,
                                                                           rel=0.05), key  # fmt: skip
        assert "fitted alone" in fitted.calibration_notes

    # two runs of one engine: pooled, said so, one profile
    again = _run(tmp_path, SHIPPED, ALL_ARMS, name="again")
    pooled = _calibrate(str(shipped), str(again), "-o", str(out), "--no-check")
    assert pooled.returncode == 0, pooled.stderr[-2000:]
    assert "every coefficient agrees within its 95% interval or by 5%: one pooled fit" in pooled.stdout
    assert out.exists() and load_profile(str(out)).provenance.steps > 0  # type: ignore[union-attr]


def test_engines_differ_only_beyond_both_intervals_and_by_a_material_share() -> None:
    import numpy as np

    from orchestrator.analysis.steps.stepfit import COEFFICIENTS, Fit
    from orchestrator.calibrate.engines import compare_engines

    def fit(per_batched: float, stderr: float) -> Fit:
        coef = np.full(len(COEFFICIENTS), 1e-3)
        coef[1] = per_batched
        se = np.full(len(COEFFICIENTS), 1e-9)
        se[1] = stderr
        return Fit(coef, np.ones(len(COEFFICIENTS), dtype=bool), (), 1000, 5, se)

    apart = compare_engines({"a": fit(2.0e-5, 1e-8), "b": fit(3.0e-5, 1e-8)})
    assert apart.differ and [d.coefficient for d in apart.differences] == ["verify.per_batched_token"]
    assert apart.lines[0] == "engines of runs a, b differ: a separate fit per run"
    assert apart.lines[1].startswith("  verify.per_batched_token: a 2e-05 s [")
    # 50% apart, but each interval +-2e-5: the data cannot tell them apart
    assert not compare_engines({"a": fit(2.0e-5, 1e-5), "b": fit(3.0e-5, 1e-5)}).differ
    # far outside both intervals, but 1% apart: no replay could tell them apart either
    alike = compare_engines({"a": fit(2.0e-5, 1e-10), "b": fit(2.02e-5, 1e-10)})
    assert not alike.differ and alike.lines[0].endswith("one pooled fit")


def test_runs_that_identify_the_model_only_together_are_pooled_and_said_so(tmp_path: Path) -> None:
    plain = _run(tmp_path, SHIPPED, ["off", "fixed1"], name="plain")  # one k: no per-draft-token cost alone
    drafted = _run(tmp_path, SHIPPED, ["off", "fixed3", "dyn"], name="drafted")
    out = tmp_path / "fitted.yaml"
    done = _calibrate(str(plain), str(drafted), "-o", str(out), "--no-check")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "one run alone cannot be fitted (cannot fit one k only: the draft cost per token" in done.stdout
    assert "one pooled fit, engines not compared" in done.stdout
    truth, fitted = load_profile(SHIPPED), load_profile(str(out))
    assert fitted.verify.per_batched_token == pytest.approx(truth.verify.per_batched_token, rel=0.05)


def test_the_step_overhead_outside_steps_is_the_mean_gap_between_busy_steps() -> None:
    import numpy as np

    from orchestrator.analysis.steps.arm_steps import ArmSteps
    from orchestrator.analysis.steps.step_model import busy_gap

    n = 5
    # a unit's first step has no gap; the idle gap before the step that only prefills is the traffic's, not the
    # engine's; the three busy gaps average 2 ms (a 4 ms stall counted in full: TPOT pays it)
    gap = np.array([np.nan, 0.001, 0.001, 0.5, 0.004])
    batch, prefill = np.array([1.0, 2, 2, 1, 2]), np.array([1.0, 1, 0, 1, 0])
    decodes = batch - prefill
    steps = ArmSteps(
        arm="off", speculative=False, dynamic=False, unit=np.array(["u/r0"] * n, dtype=object),
        engine=np.array(["e"] * n, dtype=object), seconds=np.full(n, 0.01), batch=batch, k=np.zeros(n),
        batched=batch, kv=batch * 10, gap=gap, busy=~np.isnan(gap) & (decodes > 0),
    )  # fmt: skip
    mean_gap, gaps = busy_gap([steps])
    assert mean_gap == pytest.approx(0.002) and gaps == 3


def test_a_noisy_hosts_stalls_scale_the_fit_to_the_mean_step() -> None:
    import numpy as np

    from orchestrator.analysis.steps.arm_steps import ArmSteps
    from orchestrator.analysis.steps.step_model import fit_steps

    rng = np.random.default_rng(3)
    truth = load_profile(SHIPPED)

    def arm(name: str, k: int, n: int = 3000) -> ArmSteps:
        batch = rng.integers(1, 64, n).astype(float)
        kv = batch * rng.integers(100, 2000, n)
        batched = batch * (k + 1)
        seconds = truth.verify.per_kv_token * kv + truth.verify.per_batched_token * batched + truth.verify.fixed
        if k:
            seconds += truth.draft.per_kv_token * kv + truth.draft.per_draft_token * k + truth.draft.fixed
        # one step in ten stalls (x3): the typical step is the model's, the mean one is 1.2 times it
        stall = np.where(rng.random(n) < 0.1, 3.0, 1.0)
        return ArmSteps(
            arm=name, speculative=k > 0, dynamic=False, unit=np.array(["u/r0"] * n, dtype=object),
            engine=np.array(["e"] * n, dtype=object), seconds=seconds * stall, batch=batch, k=np.full(n, float(k)),
            batched=batched, kv=kv, gap=np.full(n, np.nan), busy=np.zeros(n, dtype=bool),
        )  # fmt: skip

    fitted = fit_steps({"off": arm("off", 0), "fixed1": arm("fixed1", 1), "fixed3": arm("fixed3", 3)})
    note = next(n for n in fitted.notes if n.startswith("steps average x"))
    factor = float(note.split("x", 1)[1].split(" ")[0])
    assert factor == pytest.approx(1.2, abs=0.03)
    assert note.endswith("the robust fit's typical step (host stalls): costs scaled by it")
    # the costs' shape is the model's, their level the mean step's
    assert fitted.fit.coef[1] == pytest.approx(truth.verify.per_batched_token * factor, rel=0.05)
    assert fitted.fit.coef[2] == pytest.approx(truth.verify.fixed * factor, rel=0.05)
