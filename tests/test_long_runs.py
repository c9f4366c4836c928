"""Nothing lost over long runs: 100k requests in virtual time, and ten minutes of real time on Ray load workers
(with a fault burst in the middle). Every scheduled request is exactly one row."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from loadshapes.mixes import MixEntry, RequestMix
from loadshapes.null_server import NullConfig, NullServer, ServerThread
from loadshapes.plan import Target, WorkerPlan
from loadshapes.shapes import Day
from loadshapes.trace import read_traces
from orchestrator.campaign import Campaign
from orchestrator.simulate_campaign import simulate_campaign
from tests.ray_helpers import local_ray


def test_a_100k_request_virtual_run_has_one_row_per_request(tmp_path: Path) -> None:
    campaign = Campaign.model_validate(
        {
            "name": "long-virtual",
            "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
            "policies": {"off": "off", "fixed3": "fixed:3"},
            "shapes": {"busy": {"kind": "sustained", "rate": 50, "duration_s": 1020}},
            "mix": {"entries": [{"workload": "chat", "weight": 2}, {"workload": "editing", "weight": 1}]},
            "output": str(tmp_path / "run"),
        }
    )
    _, manifest = simulate_campaign(campaign)
    scheduled = {key: unit["scheduled"] for key, unit in manifest["units"].items()}
    assert sum(scheduled.values()) >= 100_000
    table = read_traces(str(tmp_path / "run" / "traces"), columns=["arm", "request_id", "status"])
    assert table.num_rows == sum(scheduled.values())
    assert pc.count_distinct(table["request_id"]).as_py() == table.num_rows
    for key, count in scheduled.items():
        arm = key.split("/")[0]
        assert pc.sum(pc.equal(pc.cast(table["arm"], "string"), arm)).as_py() == count


@pytest.fixture
def server() -> Iterator[ServerThread]:
    # Streams last ~0.3 s, so at any moment a few dozen requests are in flight.
    thread = ServerThread(NullServer(NullConfig(chunks=16, tokens_per_chunk=2, chunk_delay_s=0.02)))
    yield thread
    thread.stop()


def _set_fault(server: ServerThread, fault: str) -> None:
    request = urllib.request.Request(
        server.url + "/null/config", data=json.dumps({"fault": fault}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=5).read()


def test_ten_minutes_of_real_time_load_on_ray_lose_no_row(server: ServerThread, tmp_path: Path) -> None:
    from orchestrator.load_workers import run_load

    duration_s = 600.0
    shape = Day(min_rate=5, max_rate=30, duration_s=duration_s)
    plans = [
        WorkerPlan(
            campaign="long", run="r1", arm="null", shape_name="day", shape=shape, seed=11, worker=w, workers=2,
            mix=RequestMix(entries=[MixEntry(workload="chat", weight=1)]),
            target=Target(base_url=server.url, model="null-model"), trace_root=str(tmp_path / "traces"),
            flush_rows=500, flush_s=5.0, drain_s=30, request_timeout_s=30, lateness_bound_s=0.05,
        )
        for w in range(2)
    ]  # fmt: skip
    expected = shape.expected_requests

    def fault_burst() -> None:  # 10 s of HTTP 500s, then 10 s of broken streams, half-way through
        time.sleep(duration_s / 2)
        _set_fault(server, "http_500")
        time.sleep(10)
        _set_fault(server, "truncated")
        time.sleep(10)
        _set_fault(server, "none")

    with local_ray(num_cpus=4):
        burst = threading.Thread(target=fault_burst, daemon=True)
        burst.start()
        summaries = run_load(plans, cpus_per_worker=0.5, workdir=str(tmp_path / "w"))
        burst.join(60)

    assert not any(s.lost for s in summaries)
    scheduled = sum(s.scheduled for s in summaries)
    assert abs(scheduled - expected) < 5 * expected**0.5  # a Poisson count around the shape's integral
    assert sum(s.rows_written for s in summaries) == scheduled
    table = read_traces(str(tmp_path / "traces"), columns=["request_id", "status", "error_class", "worker"])
    assert table.num_rows == scheduled == len(server.server.received_ids)
    assert pc.count_distinct(table["request_id"]).as_py() == scheduled
    classes: Counter[Any] = Counter(table.column("error_class").to_pylist())
    assert classes["http_500"] > 50 and classes["truncated_stream"] > 50  # the burst, as classified rows
    assert classes[None] > 0.9 * scheduled  # and everything else answered
