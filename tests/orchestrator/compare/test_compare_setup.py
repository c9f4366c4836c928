"""compare's set-up table names which of the traffic's parts differ (seed, a shape's keys, the mix), not only
that the campaign fingerprint does (issue 40); files count by content, so two checkouts of one campaign agree."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from orchestrator.compare.setup import setup_differences


def _manifest(tmp_path: Path, **campaign: Any) -> dict[str, Any]:
    trace = tmp_path / "a.csv"
    trace.write_text("0\n0.5\n")
    base = {
        "seed": 0, "repeats": 1, "warmup": None, "engine": {"kind": "simulated"},
        "shapes": {
            "ramp": {"kind": "ramp", "rate_from": 1.0, "rate_to": 12.0, "duration_s": 24.0},
            "trace": {"kind": "replay", "path": str(trace)},
        },
        "mix": {"entries": [{"workload": "chat", "weight": 3}]},
    }  # fmt: skip
    base.update(campaign)
    return {"campaign": base, "fingerprint": "f", "arms": {}}


def _rows(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {d.what: (d.baseline, d.candidate) for d in setup_differences(baseline, candidate, [])}


def test_the_table_names_the_seed_the_shapes_keys_and_the_mix(tmp_path: Path) -> None:
    baseline = _manifest(tmp_path)
    candidate = copy.deepcopy(baseline)
    candidate["campaign"]["seed"] = 7
    candidate["campaign"]["shapes"]["ramp"]["rate_to"] = 10.0
    candidate["campaign"]["mix"]["entries"][0]["weight"] = 1
    candidate["fingerprint"] = "g"
    rows = _rows(baseline, candidate)
    assert rows["seed"] == ("0", "7")
    assert rows["shape ramp"] == ("rate_to=12.0", "rate_to=10.0")
    assert rows["mix"] == ('entries=[{"weight": 3, "workload": "chat"}]', 'entries=[{"weight": 1, "workload": "chat"}]')
    assert "shape trace" not in rows and rows["campaign fingerprint"] == ("f", "g")


def test_a_shape_on_one_side_only_and_a_trace_in_another_checkout(tmp_path: Path) -> None:
    baseline = _manifest(tmp_path)
    other = tmp_path / "clone"
    other.mkdir()
    moved = copy.deepcopy(baseline)
    moved["campaign"]["shapes"]["trace"]["path"] = str(other / "a.csv")
    (other / "a.csv").write_text("0\n0.5\n")  # the same content at another path: the same traffic
    assert _rows(baseline, moved) == {}
    (other / "a.csv").write_text("0\n0.9\n")
    del moved["campaign"]["shapes"]["ramp"]
    rows = _rows(baseline, moved)
    assert rows["shape trace"][0].startswith("path=sha256:") and rows["shape trace"] != rows["shape trace"][::-1]
    assert rows["shape ramp"] == ("present", "-")
