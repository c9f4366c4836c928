"""Bounded inputs: no input reachable from a file makes specdrill use more than a few GiB before it refuses.

Every command here runs as a subprocess under a virtual-memory cap (`ulimit -v`, 4 GiB: Python with numpy, pyarrow
and DuckDB reserves ~2-3 GiB of address space for a small run and its report). The rule: exit 2 with one line on
stderr and nothing written, or a finished run; never a traceback, never a MemoryError. The cases that once took
this machine down (issue 33) are each a test; the planned sizes are fuzzed across ten orders of magnitude.
"""

from __future__ import annotations

import json
import math
import random
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadshapes import limits
from loadshapes.mixes import MixEntry, RequestMix
from loadshapes.plan import Target, WorkerPlan
from loadshapes.replay_formats.base import TraceError
from loadshapes.replay_formats.timestamps import csv_ns
from loadshapes.shapes import Replay
from orchestrator.calibrate.vllm_profile import profile_from_vllm
from orchestrator.plan.campaign import CampaignError, load_campaign
from serve_apps.sim.profile import ProfileError, load_profile
from tests import REPO

CAP_KIB = 4 * 1024 * 1024
PROFILE = REPO / "serve_apps" / "profiles" / "llama3.1-8b-h100-eagle.yaml"
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def cap_memory() -> None:
    """`ulimit -v` in the child: its address space, so a plan that outgrows it fails there, not this machine."""
    resource.setrlimit(resource.RLIMIT_AS, (CAP_KIB * 1024, CAP_KIB * 1024))


def campaign(tmp_path: Path, name: str = "c", **changes: Any) -> Path:
    data: dict[str, Any] = {
        "name": "bounded",
        "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": {"s": {"kind": "sustained", "rate": 5, "duration_s": 4}},
        "output": str(tmp_path / f"run-{name}"),
    }
    data.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def burstgpt(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join([BURSTGPT_HEADER, *rows]) + "\n")
    return path


def normal_rows(n: int) -> list[str]:
    return [f"{i * 0.1:.1f},ChatGPT,100,50,150,Conversation log" for i in range(n)]


# ---- the known cases: each refused in one line before anything is written ----

DRIVER = textwrap.dedent("""
    import contextlib, io, json, resource, sys, traceback
    from orchestrator.cli import main
    out = []
    for args in json.loads(sys.argv[1]):
        err = io.StringIO()
        code, crash = 0, None
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:
                crash = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        out.append({"code": code, "stderr": err.getvalue(), "crash": crash})
    print(json.dumps({"cases": out, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
""")


def run_capped(cases: list[list[str]]) -> dict[str, Any]:
    """Each `specdrill ARGS` of `cases` in turn, in ONE process under the memory cap (one interpreter start for
    all): per case its exit code, stderr and the exception that escaped main(), if any; the process's peak RSS."""
    result = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cases)], capture_output=True, text=True,
                            timeout=600, check=False, preexec_fn=cap_memory)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    for args, case in zip(cases, report["cases"], strict=True):
        assert case["crash"] is None, f"specdrill {' '.join(args)}: {case['crash']}"
        assert "Traceback" not in case["stderr"], case["stderr"]
    return report


def refused(case: dict[str, Any], *expected: str) -> str:
    lines = case["stderr"].strip().splitlines()
    assert case["code"] == 2, case
    assert len(lines) == 1 and lines[0].startswith("specdrill: error: "), case["stderr"][-2000:]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def zero_cost_profile(tmp_path: Path) -> Path:
    zero = yaml.safe_load(PROFILE.read_text())
    zero["verify"] = {"per_kv_token": 0.0, "per_batched_token": 0.0, "fixed": 0.0}
    zero["step_overhead"] = 0.0
    path = tmp_path / "zero-profile.yaml"
    path.write_text(yaml.safe_dump(zero))
    return path


def known_cases(tmp_path: Path) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    """Name -> (arguments, what its one line says). The first seven are issue 33's, as found."""
    month = {"s": {"kind": "sustained", "rate": 1, "duration_s": 30 * 86400}}
    policies = {"off": "off", **{f"p{i}": f"fixed:{1 + i % 3}" for i in range(99)}}
    rows = normal_rows(40)
    rows[7] = "0.7,ChatGPT,2000000000,50,2000000050,Conversation log"
    tokens = burstgpt(tmp_path / "tokens.csv", rows)
    rows = normal_rows(10)
    rows[3] = "0.3," + "x" * 30_000_000 + ",100,50,150,Conversation log"
    line = burstgpt(tmp_path / "line.csv", rows)
    stamps = tmp_path / "stamps.csv"
    stamps.write_text("1.0\n2.0\n" + "3" * 30_000_000 + "\n4.0\n")
    scaled = burstgpt(tmp_path / "scaled.csv", normal_rows(40))
    many = burstgpt(tmp_path / "rows.csv", normal_rows(5000))
    small = {"a": {"kind": "ramp", "rate_from": 1, "rate_to": 4, "duration_s": 5}}
    three = campaign(tmp_path, "three", policies={"off": "off", "fixed2": "fixed:2", "fixed3": "fixed:3"})

    def sim(name: str, **changes: Any) -> list[str]:
        return ["simulate", str(campaign(tmp_path, name, **changes))]

    return {
        "rate 1e9 req/s": (sim("rate", shapes={"s": {"kind": "sustained", "rate": 1e9, "duration_s": 10}}),
                           ("limit requests", "20,000,000,000 requests")),
        "30-day shape": (sim("month", shapes=month), ("limit requests", "5,184,000 requests")),
        "10,000 arms": (sim("arms", policies=policies, topologies={f"t{i}": "single" for i in range(100)}),
                        ("10,000 units", "limit units")),
        "replay row of 2e9 prompt tokens": (sim("tokens", shapes={"r": {"kind": "replay", "path": str(tokens)}}),
                                            ("2,000,000,050 tokens in one request", "limit request_tokens")),
        "30 MB CSV line (BurstGPT)": (sim("line", shapes={"r": {"kind": "replay", "path": str(line)}}),
                                      (f"{line}:5: a line longer than", "line_kib")),
        "30 MB CSV line (timestamps)": (sim("stamps", shapes={"r": {"kind": "replay", "path": str(stamps)}}),
                                        (f"{stamps}:3: a line longer than", "line_kib")),
        "zero-cost profile (simulate oracle)": (
            ["simulate", "oracle", "--profile", str(zero_cost_profile(tmp_path)), "--batch-sizes", "1,2"],
            ("take no time",)),
        "zero-cost profile (campaign)": (
            sim("zero", engine={"kind": "simulated", "profile": str(zero_cost_profile(tmp_path))}), ("take no time",)),
        "replay scaled by 1e9": (sim("scaled", shapes={"r": {"kind": "replay", "path": str(scaled),
                                                              "rate_scale": 1e9}}),
                                 ("after scaling by 1e+09", "limit requests")),
        "replay rows over the limit": ([*sim("rows", shapes={"r": {"kind": "replay", "path": str(many)}}),
                                        "--limit", "replay_rows=1000"], ("more than 1,000 rows",)),
        # run: refused before any Ray cluster is looked for (there is none here)
        "run, a month": (["run", str(campaign(tmp_path, "run-month", shapes=month))], ("limit requests",)),
        "run, a month at 0.01 req/s": (
            ["run", str(campaign(tmp_path, "slow", shapes={"s": {**month["s"], "rate": 0.01}}))],
            ("limit hours", "in real time")),
        "search, 1e9 requests a unit": (
            ["search", str(campaign(tmp_path, "search", shapes=small)), "--arm", "fixed3", "--unit-requests",
             "1000000000", "-o", str(tmp_path / "run-search")], ("limit requests",)),
        "tune, a month": (["tune", str(campaign(tmp_path, "tune", shapes=month)), "-o", str(tmp_path / "run-tune")],
                          ("limit requests",)),
        "--limit units=2 on 3 units": (["simulate", str(three), "--limit", "units=2"], ("3 units", "--limit units=3")),
        "--limit without a value": (["simulate", str(three), "--limit", "units"], ("NAME=VALUE",)),
        "--limit of no such name": (["simulate", str(three), "--limit", "unknown=3"], ("NAME=VALUE",)),
        "--limit below 0": (["simulate", str(three), "--limit", "units=-1"], ("> 0",)),
    }  # fmt: skip


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[tuple[str, ...], dict[str, Any]]]]:
    tmp_path = tmp_path_factory.mktemp("known")
    cases = known_cases(tmp_path)
    report = run_capped([args for args, _ in cases.values()])
    assert report["peak_kib"] < CAP_KIB
    return tmp_path, {name: (expected, case) for (name, (_, expected)), case in zip(cases.items(), report["cases"],
                                                                                      strict=True)}  # fmt: skip


KNOWN = ["rate 1e9 req/s", "30-day shape", "10,000 arms", "replay row of 2e9 prompt tokens",
         "30 MB CSV line (BurstGPT)", "30 MB CSV line (timestamps)", "zero-cost profile (simulate oracle)",
         "zero-cost profile (campaign)", "replay scaled by 1e9", "replay rows over the limit", "run, a month",
         "run, a month at 0.01 req/s", "search, 1e9 requests a unit", "tune, a month", "--limit units=2 on 3 units",
         "--limit without a value", "--limit of no such name", "--limit below 0"]  # fmt: skip


@pytest.mark.parametrize("name", KNOWN)
def test_unbounded_inputs_are_one_line_and_write_nothing(
    known: tuple[Path, dict[str, tuple[tuple[str, ...], dict[str, Any]]]], name: str
) -> None:
    tmp_path, results = known
    expected, case = results[name]
    refused(case, *expected)
    written = [p for p in tmp_path.glob("run-*") if p.is_dir()]
    assert not written, written  # no run directory, not even a manifest


def test_a_zero_cost_profile_is_refused_where_it_is_loaded(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="take no time"):
        load_profile(str(zero_cost_profile(tmp_path)))


def test_an_slo_no_request_can_meet_runs_with_a_warning_and_a_raised_limit_runs(tmp_path: Path) -> None:
    slo = campaign(tmp_path, "slo", slo={"ttft_s": 0.001, "tpot_s": 0.001})
    three = campaign(tmp_path, "three", policies={"off": "off", "fixed2": "fixed:2", "fixed3": "fixed:3"},
                     shapes={"s": {"kind": "sustained", "rate": 2, "duration_s": 2}})  # fmt: skip
    report = run_capped([["simulate", str(slo), "--no-report"],
                         ["simulate", str(three), "--limit", "units=3", "--no-report"]])  # fmt: skip
    warned, raised = report["cases"]
    assert warned["code"] == 0 and raised["code"] == 0, report
    warnings = [line for line in warned["stderr"].splitlines() if line.startswith("specdrill: warning: ")]
    # The profile's fastest step, computed here from its coefficients (verify one token + overhead)
    p = yaml.safe_load(PROFILE.read_text())
    step_ms = (sum(p["verify"].values()) + p["step_overhead"]) * 1e3
    assert step_ms > 1.0
    assert len(warnings) == 2, warned["stderr"]
    assert "slo.ttft_s = 0.001 s: no request can meet it" in warnings[0] and f"{step_ms:.3g} ms" in warnings[0]
    assert "slo.tpot_s = 0.001 s: no request can meet it" in warnings[1]
    assert (tmp_path / "run-three" / "manifest.json").is_file()
    # A deadline a request can meet gives no warning
    fine = campaign(tmp_path, "fine", slo={"ttft_s": 0.05, "tpot_s": 0.01})
    assert load_campaign(fine).warnings() == []


def test_the_memory_estimate_bounds_a_near_limit_run(tmp_path: Path) -> None:
    """A run planned just under a lowered memory limit is accepted and its measured peak RSS stays under the
    estimate; under a limit just below the estimate the same run is refused."""
    c = campaign(tmp_path, shapes={"s": {"kind": "sustained", "rate": 30, "duration_s": 80}})
    estimate = load_campaign(c).planned_size().memory_gib
    assert 0.45 < estimate < 0.6
    probe = textwrap.dedent(f"""
        import resource, subprocess, sys
        args = [sys.executable, "-c", "from orchestrator.cli import main; main()", "simulate", {str(c)!r}]
        low = subprocess.run([*args, "--limit", "memory_gib={estimate * 0.95:.4f}"], capture_output=True, text=True)
        r = subprocess.run([*args, "--no-report", "--limit", "memory_gib=0.6"], capture_output=True, text=True)
        print(low.returncode, r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        sys.stderr.write(low.stderr + r.stderr)
    """)  # fmt: skip
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    low_rc, rc, peak_kib = (int(x) for x in result.stdout.split())
    assert low_rc == 2 and "limit memory_gib" in result.stderr.splitlines()[0], result.stderr[-2000:]
    assert rc == 0, result.stderr[-2000:]
    assert peak_kib / 2**20 < estimate, (peak_kib / 2**20, estimate)


# ---- planned sizes across ten orders of magnitude, under the cap ----


def magnitude_case(rng: random.Random, tmp_path: Path, i: int, trace: Path) -> Path:
    def log_uniform(low: float, high: float) -> float:
        return float(10 ** rng.uniform(math.log10(low), math.log10(high)))

    rate, duration = log_uniform(1e-3, 1e9), log_uniform(1e-2, 3e6)
    kind = rng.choice(["sustained", "ramp", "step", "day", "concurrency", "replay"])
    shape: dict[str, Any] = {
        "sustained": {"kind": "sustained", "rate": rate, "duration_s": duration},
        "ramp": {"kind": "ramp", "rate_from": 0, "rate_to": rate, "duration_s": duration},
        "step": {"kind": "step", "rates": [rate / 2, rate], "step_s": duration / 2},
        "day": {"kind": "day", "min_rate": rate / 10, "max_rate": rate, "duration_s": duration, "segments": 8},
        "concurrency": {"kind": "concurrency", "users": max(1, round(log_uniform(1, 1e7))), "duration_s": duration},
        "replay": {"kind": "replay", "path": str(trace), "rate_scale": log_uniform(1e-3, 1e9)},
    }[kind]
    high = max(1, round(log_uniform(1, 1e10)))
    workload = {
        "name": "w",
        "category": "chat",
        "max_tokens": max(1, round(log_uniform(1, 1e10))),
        "prompt_tokens": {"kind": "lognormal", "median": max(1.0, high / 8), "sigma": 0.5, "high": high},
        "output_tokens": {"kind": "uniform", "low": 1, "high": max(1, round(log_uniform(1, 1e9)))},
    }
    policies = {"off": "off", **{f"p{j}": f"fixed:{1 + j % 3}" for j in range(round(log_uniform(1, 300)))}}
    return campaign(tmp_path, f"m{i}", shapes={"s": shape}, policies=policies,
                    repeats=max(1, min(100, round(log_uniform(1, 100)))),
                    mix={"entries": [{"workload": workload, "weight": 1}]})  # fmt: skip


def test_planned_sizes_across_ten_orders_of_magnitude_are_one_line_or_a_report(tmp_path: Path) -> None:
    """Rates 1e-3..1e9 req/s, durations 1e-2..3e6 s, token bounds 1..1e10, 1..300 policies, 1..100 repeats, under
    limits lowered so that whatever is accepted runs in seconds (requests=3000, memory_gib=1): every case exits 2
    with one line and writes nothing, or finishes with a report, inside the 4 GiB cap."""
    rng = random.Random(33)
    trace = burstgpt(tmp_path / "trace.csv", normal_rows(200))
    paths = [magnitude_case(rng, tmp_path, i, trace) for i in range(40)]
    lowered = ["--limit", "requests=3000", "--limit", "memory_gib=1", "--limit", "units=40"]
    report = run_capped([["simulate", str(p), *lowered] for p in paths])
    accepted = 0
    for path, case in zip(paths, report["cases"], strict=True):
        where = f"{path.name}: {yaml.safe_load(path.read_text())['shapes']}"
        run_dir = tmp_path / f"run-{path.stem}"
        if case["code"] == 2:
            lines = case["stderr"].strip().splitlines()
            errors = [line for line in lines if not line.startswith("specdrill: warning: ")]
            assert len(errors) == 1 and errors[0].startswith("specdrill: error: "), f"{where}: {case['stderr']}"
            assert not run_dir.exists(), where
        else:
            assert case["code"] in (0, 3), f"{where}: {case}"  # 3: a gate failed, the report says which
            assert (run_dir / "report.html").is_file(), where
            accepted += 1
    assert 2 <= accepted < len(paths), accepted  # both outcomes are exercised
    assert report["peak_kib"] < CAP_KIB


# ---- the pieces, against figures computed here ----


def test_planned_size_is_the_shapes_integral_times_arms_and_repeats(tmp_path: Path) -> None:
    c = campaign(
        tmp_path, repeats=3,
        shapes={"a": {"kind": "sustained", "rate": 10, "duration_s": 30},
                "b": {"kind": "ramp", "rate_from": 2, "rate_to": 6, "duration_s": 10}},
        mix={"entries": [{"workload": {"name": "w", "category": "chat", "max_tokens": 300,
                                       "prompt_tokens": {"kind": "uniform", "low": 10, "high": 700},
                                       "output_tokens": {"kind": "fixed", "value": 500}}, "weight": 1}]},
    )  # fmt: skip
    size = load_campaign(c).planned_size(real_time=True)
    assert size.units == 2 * 2 * 3
    assert size.requests == pytest.approx((10 * 30 + 4 * 10) * 2 * 3)
    assert size.request_tokens == 700 + 300  # the prompt's high, the output capped by max_tokens
    assert size.hours == pytest.approx((2 * (30 + 10) * 3 + 2 * 60) / 3600)


def test_limit_flags_parse() -> None:
    parsed = limits.parse_limits(["requests=2e7", "memory-gib=16"])
    assert parsed.requests == 2e7 and parsed.memory_gib == 16 and parsed.units == limits.DEFAULT.units
    for bad in ("requests", "nope=1", "requests=x", "requests=0", "requests=inf"):
        with pytest.raises(limits.LimitSyntaxError):
            limits.parse_limits([bad])


def test_timestamp_csv_streams_within_the_line_bound(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("\n".join(f"{i * 0.5}" for i in range(1000)) + "\n")
    assert csv_ns(str(trace), None)[-1] == round(999 * 0.5 * 1e9)
    trace.write_text("1\n" + "2" * 5000 + "\n")
    with limits.using(limits.Limits(line_kib=4)), pytest.raises(TraceError, match=r"t\.csv:2: a line longer than"):
        csv_ns(str(trace), None)
    with limits.using(limits.Limits(replay_rows=10)), pytest.raises(TraceError, match="more than 10 arrivals"):
        trace.write_text("\n".join(str(i) for i in range(20)) + "\n")
        csv_ns(str(trace), None)


def test_an_acceptance_clamped_on_import_is_said(tmp_path: Path) -> None:
    """vLLM's profile gives cumulative acceptance rates; one above 1 or above the position before it is clamped
    to a conditional acceptance of 1, and the import says so in one line per position."""
    truth = load_profile(str(PROFILE))
    stats = {
        str(b): {str(k): (truth.verify.fixed + 1e-5 * b * (k + 1) + 4e-8 * b * 1024 + (2e-3 + 1e-6 * k if k else 0))
                 * 1e3 for k in range(4)}
        for b in (1, 4, 16, 64)
    }  # fmt: skip
    path = tmp_path / "vllm-profile.json"
    path.write_text(json.dumps({"max_num_speculative_tokens": 3, "acceptance_rate_per_pos": [1.7, 0.6, 0.8],
                                "batch_stats": stats}))  # fmt: skip
    fitted = profile_from_vllm(str(path), truth, name="t", context_tokens=1024, categories=["chat"])
    assert fitted.provenance is not None
    warned = [n for n in fitted.provenance.notes if n.startswith("warning: ")]
    assert len(warned) == 2, fitted.provenance.notes
    assert "acceptance_rate_per_pos[0] = 1.7 is above 1" in warned[0]
    assert "acceptance_rate_per_pos[2] = 0.8 is above position 1's 0.6" in warned[1]
    assert fitted.acceptance["chat"].per_position[0] == 1.0 and fitted.acceptance["chat"].per_position[2] == 1.0


def test_a_campaign_file_of_many_mib_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("name: huge\n# " + "x" * (9 << 20) + "\n")
    with pytest.raises(CampaignError, match=r"huge\.yaml: 9 MiB, over the 8 MiB"):
        load_campaign(path)


def test_a_worker_reads_its_replay_under_the_limits_the_run_was_planned_under(tmp_path: Path) -> None:
    """A load worker re-validates its plan's replay shape in its own process: under the plan's limits (raised with
    --limit where the run started), not its process's defaults."""
    trace = burstgpt(tmp_path / "rows.csv", normal_rows(50))
    with limits.using(limits.Limits(replay_rows=100)):
        plan = WorkerPlan(
            campaign="c", run="r", arm="a", shape_name="s", shape=Replay(path=str(trace)), mix=RequestMix(
                entries=[MixEntry(workload="chat", weight=1.0)]), target=Target(base_url="http://x", model="m"),
            trace_root=str(tmp_path),
        )  # fmt: skip
    text = plan.model_dump_json()
    with limits.using(limits.Limits(replay_rows=10)):  # a worker whose own limits are lower
        assert WorkerPlan.model_validate_json(text).limits.replay_rows == 100
        lowered = json.loads(text)
        lowered["limits"]["replay_rows"] = 10
        lowered["shape"]["path"] = str(burstgpt(tmp_path / "again.csv", normal_rows(50)))  # not read before
        with pytest.raises(ValueError, match="more than 10 rows"):
            WorkerPlan.model_validate(lowered)
