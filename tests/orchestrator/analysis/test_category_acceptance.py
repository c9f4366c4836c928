"""A simulated campaign mixing workload categories, some with acceptance of their own in the profile and some
without: summary.json's per-category acceptance is graded against the profile file's per-position figures (read
here as YAML, apart from the code under test), within the sampling error the summary states and a bound of ours.
The profile is the shipped EAGLE one (its category_map and default_category) with its categories' acceptance set
far apart (>= 0.15 at every position), so a request drafted with another category's acceptance cannot pass."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from serve_apps.sim import profile as profile_module
from tests.tiny_campaigns import as_yaml, sim_campaign

SHIPPED = Path(profile_module.__file__).parent.parent / "profiles" / "llama3.1-8b-h100-eagle.yaml"
APART = {"chat": [0.5, 0.4, 0.3], "reasoning": [0.7, 0.6, 0.5], "editing": [0.9, 0.85, 0.8]}
# category -> the profile category it drafts as: its own, Spec-Bench's math_reasoning mapped to reasoning, and
# coding (no acceptance of its own, no mapping) the profile's default, chat.
CATEGORIES = {"chat": "chat", "editing": "editing", "reasoning": "reasoning", "math_reasoning": "reasoning",
              "coding": "chat"}  # fmt: skip


def _workload(category: str) -> dict[str, object]:
    return {"workload": {
        "name": category, "category": category,
        "prompt_tokens": {"kind": "lognormal", "median": 64, "sigma": 0.3, "low": 16, "high": 256},
        "output_tokens": {"kind": "fixed", "value": 160}, "max_tokens": 160,
    }, "weight": 1}  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("categories")
    profile = yaml.safe_load(SHIPPED.read_text())
    profile["name"], profile["acceptance"] = "apart", {c: {"per_position": p} for c, p in APART.items()}
    (root / "apart.yaml").write_text(yaml.safe_dump(profile))
    campaign = sim_campaign(
        "categories",
        engine={"kind": "simulated", "profile": str(root / "apart.yaml")},
        policies={"off": "off", "k1": "fixed:1", "k3": "fixed:3"},
        shapes={"steady": {"kind": "quiet", "rate": 6, "duration_s": 60}},
        mix={"entries": [_workload(c) for c in CATEGORIES]},
        load={"drain_s": 30},
    )
    (root / "c.yaml").write_text(as_yaml(campaign))
    with pytest.raises(SystemExit) as caught:
        main(["simulate", str(root / "c.yaml"), "--output", str(root / "run")])
        raise SystemExit(0)
    assert caught.value.code in (0, None)
    return root / "run"


@pytest.fixture(scope="module")
def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _per_position(category: str) -> list[float]:
    return APART[category]


def _rows(summary: dict, arm: str) -> dict[str, dict]:
    return {r["category"]: r for r in summary["acceptance_by_category"] if r["arm"] == arm}


def test_fixed_k1_acceptance_per_category_is_the_profiles_first_position(summary: dict) -> None:
    rows = _rows(summary, "k1-single")
    assert set(rows) == set(CATEGORIES)
    for category, used in CATEGORIES.items():
        row, p1 = rows[category], _per_position(used)[0]
        assert row["drafted"] > 1500, row
        # within the summary's own 95% interval widened a little (5 categories x 2 arms checked), and within
        # 4 binomial standard errors of the draft tokens
        half = (row["rate_high"] - row["rate_low"]) / 2
        assert abs(row["acceptance_rate"] - p1) < 1.5 * half, (category, row, p1)
        assert abs(row["acceptance_rate"] - p1) < 4 * math.sqrt(p1 * (1 - p1) / row["drafted"]), (category, row)
        assert row["drafted_as"] == (None if used == category else used)


def test_fixed_k3_acceptance_length_per_category_follows_every_position(summary: dict) -> None:
    rows = _rows(summary, "k3-single")
    for category, used in CATEGORIES.items():
        p = _per_position(used)
        want = 1 + p[0] + p[0] * p[1] + p[0] * p[1] * p[2]  # 1 + E[accepted prefix of 3]
        got = rows[category]["acceptance_length"]
        # ~3000 drafting steps a category: a standard error of ~0.02; a request's last step drafts fewer than 3
        # when fewer tokens are left, a small downward pull. The nearest other category is > 0.25 away.
        assert abs(got - want) < 0.08, (category, got, want)


def test_the_run_says_which_categories_fell_back(summary: dict) -> None:
    (line,) = [h for h in summary["headline"] if "fallback" in h]
    assert "apart" in line and "2 categories" in line and "coding (" in line and ") as chat" in line
    assert "math_reasoning (" in line and ") as reasoning" in line
    off = _rows(summary, "off-single")
    assert all(r["acceptance_rate"] is None and r["drafted"] == 0 for r in off.values())


def test_the_console_says_it_before_any_figure_and_splits_acceptance(run_dir: Path, capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["report", str(run_dir)])
        raise SystemExit(0)
    assert caught.value.code in (0, None)
    out = capsys.readouterr().out.splitlines()
    fell = next(i for i, line in enumerate(out) if "simulated with its fallback" in line)
    assert fell < next(i for i, line in enumerate(out) if line.startswith("answer"))
    (k1,) = [line for line in out if line.startswith("  k1-single: ")]
    assert "coding 0." in k1 and "drafted as chat" in k1 and "math_reasoning 0." in k1 and "drafted as reasoning" in k1


def test_report_html_has_the_split(run_dir: Path) -> None:
    html = (run_dir / "report.html").read_text()
    section = html[html.index("<h2>By workload category</h2>") :].split("</pre>")[0]
    assert "acceptance by category" in section and "coding 0." in section and "drafted as chat" in section
