"""`specdrill search --real-time` on an endpoint campaign (servers someone else runs): the search runs wherever
`specdrill run` runs. Two null servers stand in for an operator's `off` and speculative servers; the
speculative one streams its tokens twice as fast, so every rate the search measures is a clear "helps"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadshapes.null_server import NullConfig, NullServer, ServerThread
from orchestrator.plan.campaign import Campaign
from orchestrator.report.build import write_report
from orchestrator.search.bracket import SearchConfig
from orchestrator.search.run import run_search
from tests.ray_helpers import local_ray

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def servers() -> Iterator[dict[str, ServerThread]]:
    # 160 and 80 ms a token, 8 tokens: the two traffic samples of a rate must agree to ~2% for a 99% interval on
    # two (t = 63.7) to stay above 1, and a loaded host's timer jitter, additive per token, is a smaller share of
    # longer tokens. At 40 and 20 ms (16 tokens) a clean-clone run's two samples at 4 req/s landed 4% apart
    # (1.991, 1.913: undecided); a request still takes 1.28 s at most.
    started = {
        "off-single": ServerThread(NullServer(NullConfig(chunks=8, chunk_delay_s=0.16))),
        "fixed3-single": ServerThread(NullServer(NullConfig(chunks=8, chunk_delay_s=0.08))),
    }
    yield started
    for server in started.values():
        server.stop()


def test_a_real_time_search_runs_on_an_endpoint_campaign(servers: dict[str, ServerThread], tmp_path: Path) -> None:
    campaign = Campaign.model_validate({
        "name": "search-endpoint",
        "engine": {"kind": "endpoint", "model": "null-model", "urls": {n: s.url for n, s in servers.items()}},
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "topologies": {"single": "single"},
        "shapes": {"calm": {"kind": "quiet", "rate": 2, "duration_s": 5}},
        "mix": {"entries": [{"workload": "chat", "weight": 1}]},
        "warmup": {"requests": 0},  # the null server only streams: nothing to read back from a warm-up
        "load": {"workers": 1, "drain_s": 10},
        "output": str(tmp_path / "unused"),
    })  # fmt: skip
    # 4-16 req/s, not 2-8: a unit lasts unit_requests / rate, and the null servers keep up at any of these rates.
    config = SearchConfig(low=4, high=8, min_rate=2, max_rate=16, unit_requests=24, tolerance=0.5,
                          max_units_per_rate=2, budget_requests=400)  # fmt: skip
    out = tmp_path / "run"
    lines: list[str] = []
    with local_ray(num_cpus=4) as info:
        record = run_search(campaign, arm="fixed3", against="off", output=str(out), config=config, mode="real",
                            address=str(info["gcs_address"]), echo=lines.append).record  # fmt: skip
    assert lines[0].startswith("search: fixed3-single against off-single (real time), rates 4-8 req/s")
    # Nothing was deployed: the units went to the operator's servers, which received every request sent.
    manifest = json.loads((out / "manifest.json").read_text())
    assert {a: manifest["arms"][a]["url"] for a in servers} == {n: s.url for n, s in servers.items()}
    counted = [s for s in record.steps if s.discarded is None]
    assert counted and all(s.point.ratio is not None and s.point.ratio > 1.3 for s in counted)
    assert record.outcome is not None
    assert record.outcome.kind in ("helps_everywhere", "budget"), record.outcome.message
    if record.outcome.kind == "helps_everywhere":
        assert record.outcome.message.startswith("fixed3-single helps at every rate up to 16 req/s")
    summary = write_report(str(out))
    assert all(u.rows == u.scheduled for u in summary.units)
    sent = {a: sum(u.scheduled for u in summary.units if u.unit.arm == a) for a in servers}
    assert {a: len(s.server.received_ids) for a, s in servers.items()} == sent
