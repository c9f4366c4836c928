from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SPECDRILL = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECDRILL, *args], capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["simulate", "fixed-batch", "--policy", "fixed:0"], "policy 'fixed:0'"),
        (["simulate", "fixed-batch", "--batch-sizes", "1,x"], "--batch-sizes"),
        (["simulate", "fixed-batch", "--batch-sizes", "1,4096"], "max_num_seqs"),
        (["simulate", "fixed-batch", "--profile", "nope"], "unknown profile 'nope'"),
        (["simulate", "fixed-batch", "--profile", "/no/such.yaml"], "does not exist"),
        (["simulate", "fixed-batch", "--workload", "poetry"], "--workload 'poetry'"),
        (["simulate", "fixed-batch", "--topology", "ring:3"], "--topology 'ring:3'"),
        (["simulate", "sweep", "--rates", "0,5"], "--rates"),
        (["simulate", "sweep", "--duration", "-1"], "--duration"),
        (["simulate", "sweep", "--policies", "dynamic:3:2-10=3"], "must start at 1"),
        (["simulate", "sweep", "--policies", "dynamic:3:1-10=3,5-20=1"], "overlap"),
        (["simulate", "sweep", "--bogus"], "--bogus"),
        (["simulate", "warp"], "warp"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(args: list[str], needle: str) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("specdrill: error:") and needle in lines[0]
    assert result.stdout == ""


def test_bad_profile_file_names_the_field(tmp_path: Path) -> None:
    from serve_apps.sim.profile import load_profile

    text = Path(load_profile.__code__.co_filename).parent.joinpath("../profiles/llama3.1-8b-h100-eagle.yaml")
    broken = text.resolve().read_text().replace("per_batched_token: 2.101e-05", "per_batched_token: -1.0")
    path = tmp_path / "mine.yaml"
    path.write_text(broken)
    result = run("simulate", "fixed-batch", "--profile", str(path), "--batch-sizes", "1")
    assert result.returncode == 2
    assert "verify.per_batched_token" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_user_profile_file_is_used(tmp_path: Path) -> None:
    from importlib import resources

    source = resources.files("serve_apps").joinpath("profiles/llama3.1-8b-h100-eagle.yaml").read_text()
    path = tmp_path / "slow-gpu.yaml"
    path.write_text(
        source.replace("name: llama3.1-8b-h100-eagle", "name: slow-gpu").replace("fixed: 5.886e-03", "fixed: 2.0e-02")
    )
    result = run("simulate", "fixed-batch", "--profile", str(path), "--batch-sizes", "1", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["profile"] == "slow-gpu"
    assert data["points"][0]["off_tokens_per_s"] < 60  # a 20 ms step floor caps one sequence near 45 tok/s


def test_fixed_batch_json() -> None:
    result = run(
        "simulate",
        "fixed-batch",
        "--policy",
        "fixed:3",
        "--batch-sizes",
        "1,8",
        "--workload",
        "reasoning",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [p["batch_size"] for p in data["points"]] == [1, 8]
    assert data["points"][0]["speedup"] > data["points"][1]["speedup"] > 1


def test_sweep_shows_the_crossover() -> None:
    """Speculation ahead at a low rate; plain decoding ahead near saturation."""
    result = run(
        "simulate", "sweep", "--workload", "chat", "--rates", "10,60", "--duration", "30",
        "--policies", "off,fixed:3,dynamic:3:1-64=3,65-128=1,129-512=0", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    by = {(p["rate"], p["policy"].split("-")[0]): p["summary"] for p in data["points"]}
    low_off, low_fixed = by[(10.0, "off")], by[(10.0, "fixed")]
    assert low_fixed["tpot"]["p50"] < 0.75 * low_off["tpot"]["p50"]
    assert low_fixed["e2e"]["p50"] < low_off["e2e"]["p50"]
    high_off, high_fixed, high_dyn = by[(60.0, "off")], by[(60.0, "fixed")], by[(60.0, "dynamic")]
    assert high_off["goodput"] > high_fixed["goodput"]
    assert high_off["completion_rate"] > high_fixed["completion_rate"]
    assert high_off["goodput"] > high_dyn["goodput"]
    # The dynamic arm really ran smaller k under load.
    assert by[(10.0, "dynamic")]["mean_executed_k"] > 2.5 > high_dyn["mean_executed_k"]
    for summary in by.values():
        for key in ("ttft", "tpot", "e2e", "queue_wait"):
            assert summary[key]["p50"] is not None and summary[key]["p99"] >= summary[key]["p50"]


def test_version() -> None:
    from importlib.metadata import version

    result = run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"specdrill, version {version('specdrill')}"
