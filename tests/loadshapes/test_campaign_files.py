"""A replay's trace and a mix's dataset named in a campaign are read relative to the campaign file's directory
(loadshapes/campaign_files.py), whatever the working directory; absolute paths as written (issue 40: a relative
replay path was read from the working directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadshapes.shapes import Replay
from orchestrator.plan.campaign import CampaignError, load_campaign


def _campaign(path: Path, trace: str, dataset: str | None = None) -> Path:
    mix = {"dataset": dataset} if dataset else {"entries": [{"workload": "chat", "weight": 1}]}
    data = {
        "name": "paths", "engine": {"kind": "simulated"}, "policies": {"off": "off"},
        "shapes": {"trace": {"kind": "replay", "path": trace, "format": "csv"}}, "mix": mix,
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp/traces/a.csv (3 arrivals), tmp/data/chat.jsonl, and a working directory elsewhere, holding a decoy
    traces/a.csv of 5 arrivals: read from the working directory, the count would say so."""
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "a.csv").write_text("0\n0.5\n1.0\n")
    (tmp_path / "data").mkdir()
    row = {"category": "chat", "prompt": "hello there", "max_tokens": 8}
    (tmp_path / "data" / "chat.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "elsewhere" / "traces").mkdir(parents=True)
    (tmp_path / "elsewhere" / "traces" / "a.csv").write_text("0\n0.1\n0.2\n0.3\n0.4\n")
    return tmp_path


def test_a_relative_replay_path_is_read_from_the_campaign_files_directory(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree / "elsewhere")
    campaign = load_campaign(_campaign(tree / "campaigns" / "c.yaml", "../traces/a.csv", "../data/chat.jsonl"))
    shape = campaign.shapes["trace"]
    assert isinstance(shape, Replay)
    assert shape.paths == (str(tree / "traces" / "a.csv"),) and shape.expected_requests == 3
    assert campaign.mix.dataset == str(tree / "data" / "chat.jsonl")
    assert [r.prompt for r in campaign.mix.sample(2, seed=0)] == ["hello there"] * 2
    # The same campaign file named by a relative path from another directory reads the same files.
    monkeypatch.chdir(tree / "campaigns")
    again = load_campaign("c.yaml")
    assert again.shapes["trace"] == shape and again.mix.dataset == campaign.mix.dataset


def test_an_absolute_path_is_read_as_written_and_a_missing_file_is_named_resolved(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree / "elsewhere")
    absolute = str(tree / "elsewhere" / "traces" / "a.csv")
    shape = load_campaign(_campaign(tree / "campaigns" / "abs.yaml", absolute)).shapes["trace"]
    assert isinstance(shape, Replay) and shape.paths == (absolute,) and shape.expected_requests == 5
    # Relative to the campaign, campaigns/traces/a.csv does not exist (though traces/a.csv does here): the message
    # names the file that was looked for.
    with pytest.raises(CampaignError, match=f"{tree / 'campaigns' / 'traces' / 'a.csv'}: no such file"):
        load_campaign(_campaign(tree / "campaigns" / "rel.yaml", "traces/a.csv"))


def test_a_run_reads_the_resolved_path_back_from_its_manifest(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The campaign a run records (its manifest) is validated again without the campaign file: the path it holds is
    the resolved one, so `specdrill report` from any directory reads the same trace."""
    from orchestrator.plan.campaign import Campaign

    monkeypatch.chdir(tree / "elsewhere")
    campaign = load_campaign(_campaign(tree / "campaigns" / "c.yaml", "../traces/a.csv"))
    recorded = Campaign.model_validate(campaign.model_dump(mode="json", by_alias=True))
    assert recorded.shapes["trace"] == campaign.shapes["trace"]


def test_two_checkouts_of_one_campaign_send_the_same_traffic_and_a_changed_trace_does_not(tmp_path: Path) -> None:
    """The resolved path is absolute, so a campaign copied to a second checkout names another path: its runs must
    still resume, pair and pass compare's traffic check (the files' content decides), and a trace whose content
    changed must not."""
    import shutil

    from orchestrator.compare.setup import traffic_differences
    from orchestrator.rundir.manifest import fingerprint

    first, second = tmp_path / "one", tmp_path / "two"
    (first / "traces").mkdir(parents=True)
    (first / "traces" / "a.csv").write_text("0\n0.5\n1.0\n")
    _campaign(first / "campaigns" / "c.yaml", "../traces/a.csv")
    shutil.copytree(first, second)
    a, b = load_campaign(first / "campaigns" / "c.yaml"), load_campaign(second / "campaigns" / "c.yaml")
    assert a.shapes["trace"] != b.shapes["trace"]  # the paths differ ...
    assert fingerprint(a) == fingerprint(b) and traffic_differences(a, b) == []  # ... the traffic does not
    (second / "traces" / "a.csv").write_text("0\n0.5\n1.5\n")
    changed = load_campaign(second / "campaigns" / "c.yaml")
    assert fingerprint(a) != fingerprint(changed)
    assert traffic_differences(a, changed)[0] == "shapes (trace differs)"
