"""A category's figures carry the spread between traffic samples. Two repeats (each its own traffic) of a light
chat/coding mix on a profile where the categories accept far apart (0.8/0.7/0.6 and 0.3/0.2/0.1): summary.json's
acceptance_by_category and speedup_by_category name 2 samples, and a category's acceptance interval is at least
as wide as Student's t across the two samples' own figures (read from the trace here, apart from the code under
test), never just the requests' spread within them. With the two samples planted far apart (a table of pairs
built here), the speedup interval holds both samples' ratios; the pairs' spread alone would not."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest
import yaml

from orchestrator.analysis.opmap.bands import Band
from orchestrator.analysis.opmap.categories import acceptance_lines, category_acceptance
from orchestrator.analysis.opmap.category_speedup import category_speedups
from orchestrator.cli import main
from tests.orchestrator.decide.test_recommend_categories import SHIPPED, category_workload
from tests.tiny_campaigns import as_yaml, sim_campaign

T1 = 12.706204736174707  # Student's t, 1 degree of freedom, 97.5%


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("samples")
    profile = yaml.safe_load(SHIPPED.read_text())
    profile["name"] = "apart"
    profile["acceptance"] = {"chat": {"per_position": [0.8, 0.7, 0.6]}, "coding": {"per_position": [0.3, 0.2, 0.1]}}
    profile.pop("category_map")
    (root / "p.yaml").write_text(yaml.safe_dump(profile))
    campaign = sim_campaign(
        "samples", engine={"kind": "simulated", "profile": str(root / "p.yaml")}, repeats=2,
        policies={"off": "off", "k3": "fixed:3"}, shapes={"light": {"kind": "quiet", "rate": 20, "duration_s": 10}},
        mix={"entries": [category_workload("chat", 3), category_workload("coding", 1)]}, load={"drain_s": 30},
    )  # fmt: skip
    (root / "c.yaml").write_text(as_yaml(campaign))
    with pytest.raises(SystemExit) as caught:
        main(["simulate", str(root / "c.yaml"), "--output", str(root / "run")])
        raise SystemExit(0)
    assert caught.value.code in (0, None)
    return root / "run"


def _per_sample(run: Path) -> dict[str, list[float]]:
    """category -> the k3 arm's accepted / drafted in each repeat, from the trace files."""
    rows = duckdb.sql(
        "SELECT category, repeat, sum(accepted_tokens) / sum(drafted_tokens) FROM read_parquet("
        f"'{run}/traces/**/*.parquet', hive_partitioning = true) WHERE arm = 'k3-single' GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    found: dict[str, list[float]] = {}
    for category, _, rate in rows:
        found.setdefault(category, []).append(float(rate))
    return found


def test_acceptance_per_category_is_as_wide_as_its_samples_spread(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = {r["category"]: r for r in summary["acceptance_by_category"] if r["arm"] == "k3-single"}
    samples = _per_sample(run_dir)
    assert set(rows) == set(samples) == {"chat", "coding"}
    for category, row in rows.items():
        first, second = samples[category]
        assert row["samples"] == 2
        assert row["rate_low"] <= min(first, second) and row["rate_high"] >= max(first, second), (row, samples)
        # Student's t on two samples: the mean of two is +- t x |a - b| / 2 (equal weights; ~7% apart here)
        half = (row["rate_high"] - row["rate_low"]) / 2
        assert half >= 0.8 * T1 * abs(first - second) / 2, (category, row, samples)
    assert all(r["samples"] == 2 for r in summary["speedup_by_category"] if r["pairs"] >= 30)


def test_the_console_says_its_intervals_are_across_samples(run_dir: Path, capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["report", str(run_dir)])
        raise SystemExit(0)
    assert caught.value.code in (0, None)
    out = capsys.readouterr().out
    assert "acceptance by category (accepted / drafted, 95% interval over requests and across 2 traffic samples)" in out


def _pairs_connection(shift: float) -> SimpleNamespace:
    """A `scored` table of 200 coding pairs in one band: repeat 0's log ratios about +shift, repeat 1's about
    -shift, each sample's own spread 0.01; and 100 chat pairs at 0.3 in each repeat alike."""
    con = duckdb.connect()
    con.execute("""CREATE TABLE scored AS
        SELECT 0 AS band_0, 'k3-single' AS arm, category, repeat, true AS pair_0, true AS both_usable,
               0.0 AS log_tpot, centre + 0.01 * sin(i) AS twin_log_tpot
        FROM (SELECT i, i % 2 AS repeat, CASE WHEN i < 200 THEN 'coding' ELSE 'chat' END AS category,
                     CASE WHEN i >= 200 THEN 0.3 WHEN i % 2 = 0 THEN ? ELSE -? END AS centre
              FROM range(400) t(i))""", [shift, shift])  # fmt: skip
    return SimpleNamespace(con=con)


def test_a_category_whose_samples_disagree_gets_their_spread(monkeypatch) -> None:
    batch_map = SimpleNamespace(settings=SimpleNamespace(margin=0.02), bands=[Band(label="1-8", low=1, high=9)])
    rows = {r.category: r for r in category_speedups(_pairs_connection(0.1), batch_map)}
    coding, chat = rows["coding"], rows["chat"]
    assert coding.samples == 2 and coding.pairs == 200
    # each sample's ratio, e^0.1 and e^-0.1, inside the interval: the pairs alone give ~ +-1.4% around 1.0
    assert coding.low < math.exp(-0.1) and coding.high > math.exp(0.1), coding
    assert coding.verdict.value == "no_difference"
    # samples that agree keep the pairs' own interval: chat's is a few thousandths wide, and it helps
    assert chat.high / chat.low < 1.01 and chat.verdict.value == "helps", chat


def test_one_sample_keeps_the_interval_over_requests() -> None:
    con = duckdb.connect()
    con.execute("""CREATE TABLE requests AS SELECT 'k3-single' AS arm, 'coding' AS category, 0 AS repeat,
                   30 AS drafted, (i % 10)::INTEGER AS accepted, 10 AS spec_steps FROM range(100) t(i)""")
    (row,) = category_acceptance(SimpleNamespace(con=con), None)
    assert row.samples == 1 and row.rate_low is not None and row.rate_high is not None
    assert 0.1 < row.rate_low < 0.15 < row.rate_high < 0.2, row
    assert "across" not in acceptance_lines([row, row.model_copy(update={"category": "chat"})])[0]
