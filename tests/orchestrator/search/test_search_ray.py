"""`specdrill search --real-time`: the same search through `specdrill run`'s runner on Ray (deploy, load workers,
traces, step timelines), on the simulated costly-verify arms slowed 4x so that the crossover (~28 req/s in
virtual time) lies at a few requests per second of wall time. A short search: 20-request units (5 s at the low
end; each unit also waits out its last requests, seconds at this speed) and a budget of about four steps: the low
and high ends, then the bracket narrowed or a rate measured again."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.decide.ground_truth import costly_verify_profile, crossover_campaign
from orchestrator.plan.campaign import Campaign
from orchestrator.report.build import write_report
from orchestrator.search.bracket import SearchConfig
from orchestrator.search.run import SEARCH_FILE, run_search
from tests.ray_helpers import free_port, local_ray

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    with local_ray(num_cpus=8) as info:
        yield str(info["gcs_address"])


@pytest.fixture(scope="module")
def serve_port() -> int:
    return free_port()  # one for the module: Serve's proxy stays up between the searches on the same Ray


def _campaign(tmp_path: Path, serve_port: int, name: str, **load: float) -> Campaign:
    """The costly-verify crossover campaign slowed 4x, on the module's Serve port."""
    profile = tmp_path / "costly.yaml"
    profile.write_text(yaml.safe_dump(costly_verify_profile()))
    data = crossover_campaign(profile, tmp_path / "unused", rates=[4, 14], duration_s=10)
    data["name"] = name
    data["engine"]["time_scale"] = 4.0
    data["serve"] = {"host": "127.0.0.1", "port": serve_port}
    data["load"] = {"workers": 1, "drain_s": 10, **load}
    data["warmup"] = {"requests": 2}
    return Campaign.model_validate(data)


def test_a_real_time_search_on_ray_brackets_the_crossover_in_a_run_directory(
    ray_address: str, serve_port: int, tmp_path: Path
) -> None:
    campaign = _campaign(tmp_path, serve_port, "search-ray")
    # 170: room for four steps of ~40 requests (both arms), not five.
    config = SearchConfig(low=4, high=14, min_rate=2, max_rate=28, unit_requests=20, tolerance=0.5,
                          max_units_per_rate=2, budget_requests=170)  # fmt: skip
    out = tmp_path / "run"
    lines: list[str] = []
    record = run_search(campaign, arm="fixed3", against="off", output=str(out), config=config, mode="real",
                        address=ray_address, echo=lines.append).record  # fmt: skip
    assert lines[0].startswith("search: fixed3-single against off-single (real time), rates 4-14 req/s")
    assert record.outcome is not None and record.steps
    # A unit whose engine lagged (the host could not keep pace: the CI runner's first unit once lagged 28% and
    # measured 0.87) is kept but not counted; the step runs again.
    counted = [s for s in record.steps if s.discarded is None]
    first = counted[0].point
    assert first.rate == 4 and first.ratio is not None and first.ratio > 1  # k = 3 helps at a quarter of the crossover
    # 20-request units: a rate near the crossing may stay undecided, and the words must say which it was.
    assert record.outcome.kind in ("crossover", "crossover_wide", "budget", "undecided")
    message = record.outcome.message
    if record.outcome.kind == "crossover":
        assert message.startswith("crossover between ") and "(bracket within 50%)" in lines[-1]
    elif record.outcome.kind == "crossover_wide":
        assert message.startswith("crossover between ") and "not the 50% asked" in message
    elif record.outcome.kind == "budget":
        # The operator's 170, with what went to units not counted when one lagged.
        assert re.match(r"budget spent \(\d+ of 170 requests(, \d+ of them in units not counted)?\): ", message)
    else:
        assert message.startswith("no crossover established for fixed3-single against off-single: ")
    assert json.loads((out / SEARCH_FILE).read_text())["lines"] == lines
    summary = write_report(str(out))
    assert summary.mode == "real" and len(summary.units) == 2 * len(record.steps)
    assert all(u.rows == u.scheduled for u in summary.units)


def test_a_unit_whose_engine_lagged_is_not_counted_and_the_search_says_the_host_could_not_keep_pace(
    ray_address: str, serve_port: int, tmp_path: Path
) -> None:
    # Any lag at all exceeds this bound (a sleep always overshoots a little), so every unit counts as lagged: the
    # search must keep them in the run directory, take no verdict from them and stop saying why. At 10 req/s a
    # 20-request unit lasts 2 s.
    campaign = _campaign(tmp_path, serve_port, "search-lag", engine_lag_bound=1e-9)
    config = SearchConfig(low=10, high=20, min_rate=2, max_rate=28, unit_requests=20, tolerance=0.5,
                          max_units_per_rate=2, max_lagged_units=1)  # fmt: skip
    out = tmp_path / "run"
    lines: list[str] = []
    record = run_search(campaign, arm="fixed3", against="off", output=str(out), config=config, mode="real",
                        address=ray_address, echo=lines.append).record  # fmt: skip
    assert record.points == [] and len(record.steps) == 2
    assert all(s.discarded and s.discarded.startswith("engine lagged in ") for s in record.steps)
    assert [s.step.rate for s in record.steps] == [10, 10]  # the same step again: nothing was learned from it
    for n, line in enumerate(lines[1:3], 1):
        assert line.startswith(f"{n:>2}.     10 req/s  not counted: engine lagged in ")
        assert "(bound 0%" in line and "this unit alone: ratio " in line
    assert record.outcome is not None and record.outcome.kind == "host_lagged"
    assert lines[3].startswith("no answer: the host could not keep pace with the simulated engine in 2 units "
                               "(at 10 req/s;")  # fmt: skip
    assert record.requests == sum(s.point.requests for s in record.steps) > 0
    summary = write_report(str(out))
    assert len(summary.units) == 4 and len(summary.engine_lagged_units) >= 2
    assert "not counted: engine lagged in " in (out / "report.html").read_text()
