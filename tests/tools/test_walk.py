"""tools/walk.py: the walk of a campaign file through `specdrill simulate`, and the output check beside it. The
walk of a small campaign holds the bounds the quickstart's walk was brought to (a campaign's arms built once per
load, its profile read once per load, the campaign climbed back into at fewer than half the call sites)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from tests.tiny_campaigns import two_shapes
from tools.walk import json_differences, pinned, place_of, walk_simulate

# The quickstart's walk climbed back into the campaign at 18 call sites before its arms were kept and handed down;
# a campaign's flow through `specdrill simulate` does not depend on its size, so a small one shows the same.
CLIMBS_BEFORE = 18


def test_the_walk_of_a_small_campaign(tmp_path: Path) -> None:
    campaign = tmp_path / "walk.yaml"
    campaign.write_text(two_shapes("walk"))
    walk, code = walk_simulate(str(campaign), str(tmp_path / "run"), console=str(tmp_path / "console.txt"))
    assert code == 0, (tmp_path / "console.txt").read_text()
    counts = walk.as_dict()
    # Two loads: the command's, and the report's from the run's manifest; each builds its arms and reads its
    # profile once, and the profile's content is parsed at most once in the process.
    assert counts["arm_lists_built"] == 2, counts
    assert counts["profile_reads"] == 2, counts["profile_read_paths"]
    assert counts["profile_parses"] <= 1
    assert 0 < counts["climbs"] < CLIMBS_BEFORE / 2, counts["climb_sites"]
    assert any("execute/runner.py" in site for site in counts["climb_sites"])  # the unit loop asks for the arms
    assert counts["stage_climbs"] >= counts["climbs"]
    assert counts["entries"]["orchestrator/plan/campaign.py"] >= 1


def test_stages_follow_the_flow() -> None:
    root = Path(__file__).resolve().parents[2] / "orchestrator"
    places = {name: place_of(str(root / name)) for name in ("cli/simulate.py", "plan/campaign.py", "rundir/layout.py",
                                                             "execute/runner.py", "analysis/summary.py",
                                                             "decide/oracle.py", "report/build.py")}  # fmt: skip
    stages = [p.stage for p in places.values() if p is not None]
    assert stages == sorted(stages) and len(set(stages)) == len(places)
    assert place_of(str(root / "logs.py")) is None  # a root utility is looked through
    assert place_of(__file__) is None


def test_json_differences_floats_to_twelve_digits_seal_left_out() -> None:
    before = {"a": [1.0000000000001, 2], "evidence": {"seal": "x", "traces": "t"}}
    assert json_differences(before, {"a": [1.0000000000002, 2], "evidence": {"seal": "y", "traces": "t"}}) == []
    assert json_differences(before, {"a": [1.001, 2], "evidence": {"seal": "x", "traces": "t"}}) == [
        "$.a[0]: 1.0000000000001, then 1.001"
    ]
    assert json_differences(before, {"a": [1.0000000000001, 2], "evidence": {"seal": "x", "traces": "u"}})
    assert json_differences({"a": 1}, {"b": 1}) == ["$: keys ['a', 'b'] in one only"]
    assert json_differences({"a": 1}, {"a": 1.0})  # a type changed is a difference


def test_pinned_ids_and_clock_then_restored() -> None:
    real = (uuid.uuid4, time.gmtime)
    with pinned():
        first = [uuid.uuid4() for _ in range(3)]
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    with pinned():
        assert [uuid.uuid4() for _ in range(3)] == first
    assert stamp == "20260101T000000"
    assert (uuid.uuid4, time.gmtime) == real
