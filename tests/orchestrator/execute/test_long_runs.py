"""Nothing lost over long runs: 10k requests in virtual time, and a minute of real time on Ray load workers (with a
fault burst in the middle; ten minutes in `make bench-soak`). Every scheduled request is exactly one row.

The virtual run was 100k requests (two minutes here): each unit's rows are one part file of one row group either
way (pyarrow's row group holds 1Mi rows), so 10k takes the same path and proves the same property."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from loadshapes.null_server import NullConfig, NullServer, ServerThread
from loadshapes.trace import read_traces
from orchestrator.plan.campaign import Campaign
from orchestrator.virtual.campaign import simulate_campaign
from tests.soak import soak


def test_a_10k_request_virtual_run_has_one_row_per_request(tmp_path: Path) -> None:
    campaign = Campaign.model_validate(
        {
            "name": "long-virtual",
            "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
            "policies": {"off": "off", "fixed3": "fixed:3"},
            "shapes": {"busy": {"kind": "sustained", "rate": 50, "duration_s": 110}},
            "mix": {"entries": [{"workload": "chat", "weight": 2}, {"workload": "editing", "weight": 1}]},
            "output": str(tmp_path / "run"),
        }
    )
    _, manifest = simulate_campaign(campaign)
    scheduled = {key: unit["scheduled"] for key, unit in manifest["units"].items()}
    assert sum(scheduled.values()) >= 10_000
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


def test_a_minute_of_real_time_load_on_ray_loses_no_row(server: ServerThread, tmp_path: Path) -> None:
    # The ten-minute version, with its memory and lateness drift, is `make bench-soak`
    # (docs/engineering/performance.md).
    shape, summaries, table = soak(server, tmp_path, duration_s=60.0, burst_s=5.0)
    expected = shape.expected_requests
    assert not any(s.lost for s in summaries)
    scheduled = sum(s.scheduled for s in summaries)
    assert abs(scheduled - expected) < 5 * expected**0.5  # a Poisson count around the shape's integral
    assert sum(s.rows_written for s in summaries) == scheduled
    assert table.num_rows == scheduled == len(server.server.received_ids)
    assert pc.count_distinct(table["request_id"]).as_py() == scheduled
    classes: Counter[Any] = Counter(table.column("error_class").to_pylist())
    assert classes["http_500"] > 25 and classes["truncated_stream"] > 25  # the burst, as classified rows
    assert classes[None] > 0.7 * scheduled  # and everything else answered
