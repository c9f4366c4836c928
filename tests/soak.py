"""Real-time load on Ray load workers against the null server, with a fault burst half-way: the scenario the
suite runs for 60 s (tests/orchestrator/execute/test_long_runs.py) and `make bench-soak` for ten minutes
(benchmarks/bench_soak.py)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from loadshapes.mixes import MixEntry, RequestMix
from loadshapes.null_server import ServerThread
from loadshapes.plan import Target, WorkerPlan
from loadshapes.shapes import Day
from loadshapes.trace import read_traces
from orchestrator.execute.load_workers import run_load
from orchestrator.rundir.worker_summary import WorkerSummary
from tests.ray_helpers import local_ray

SOAK_COLUMNS = ["request_id", "status", "error_class", "worker", "scheduled_ns", "send_lateness_ns"]


def set_fault(server: ServerThread, fault: str) -> None:
    request = urllib.request.Request(
        server.url + "/null/config", data=json.dumps({"fault": fault}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=5).read()


def soak(
    server: ServerThread, workdir: Path, *, duration_s: float, burst_s: float,
    during: Callable[[threading.Event], None] | None = None,
) -> tuple[Day, list[WorkerSummary], pa.Table]:
    """A day-shaped load of 5-30 req/s over `duration_s` on two workers; half-way, `burst_s` of HTTP 500s then
    `burst_s` of broken streams. `during` runs in a thread for the load's length (a sampler), told when to end."""
    shape = Day(min_rate=5, max_rate=30, duration_s=duration_s)
    plans = [
        WorkerPlan(
            campaign="long", run="r1", arm="null", shape_name="day", shape=shape, seed=11, worker=w, workers=2,
            mix=RequestMix(entries=[MixEntry(workload="chat", weight=1)]),
            target=Target(base_url=server.url, model="null-model"), trace_root=str(workdir / "traces"),
            flush_rows=500, flush_s=5.0, drain_s=30, request_timeout_s=30, lateness_bound_s=0.05,
        )
        for w in range(2)
    ]  # fmt: skip

    def fault_burst() -> None:
        time.sleep(duration_s / 2)
        set_fault(server, "http_500")
        time.sleep(burst_s)
        set_fault(server, "truncated")
        time.sleep(burst_s)
        set_fault(server, "none")

    done = threading.Event()
    threads = [threading.Thread(target=fault_burst, daemon=True)]
    if during is not None:
        threads.append(threading.Thread(target=during, args=(done,), daemon=True))
    with local_ray(num_cpus=4):
        for thread in threads:
            thread.start()
        summaries = run_load(plans, cpus_per_worker=0.5, workdir=str(workdir / "w"))
        done.set()
        for thread in threads:
            thread.join(60)
    return shape, summaries, read_traces(str(workdir / "traces"), columns=SOAK_COLUMNS)
