"""A campaign's arms are built once per loaded campaign, and its profile's YAML read once per load: the cache
follows the campaign (a copy that changes what the arms are built from builds its own) and the file (a profile
changed on disk is read again by the next load)."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import orchestrator.plan.campaign as campaign_module
import serve_apps.sim.profile as profile_module
from orchestrator.plan.campaign import Campaign, load_campaign
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.sim.profile import profile_parses
from tests.tiny_campaigns import DYN, as_yaml, four_arms

SHAPES = {"ramp": {"kind": "ramp", "rate_from": 1, "rate_to": 8, "duration_s": 6}}


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the campaign module built a campaign's arms (one entry per build)."""
    calls: list[int] = []
    real = campaign_module.build_arms

    def counted(**kwargs: Any) -> Any:
        calls.append(1)
        return real(**kwargs)

    monkeypatch.setattr(campaign_module, "build_arms", counted)
    return calls


@pytest.fixture
def profile_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every profile file the profile loader read (a profile given by path)."""
    paths: list[Path] = []
    real = profile_module.read_text

    def counted(path: Path, what: str, error: type[ValueError]) -> str:
        paths.append(path)
        return real(path, what, error)

    monkeypatch.setattr(profile_module, "read_text", counted)
    return paths


def _campaign(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "campaign.yaml"
    path.write_text(as_yaml(four_arms("cached", shapes=SHAPES, **changes)))
    return path


def _own_profile(tmp_path: Path) -> Path:
    """The shipped eagle profile as a file of the user's own (a path the loader reads, not a packaged resource)."""
    shipped = resources.files("serve_apps").joinpath("profiles", "llama3.1-8b-h100-eagle.yaml")
    own = tmp_path / "my-h100.yaml"
    with resources.as_file(shipped) as source:
        shutil.copyfile(source, own)
    return own


def _use_everything(campaign: Campaign) -> None:
    """What `specdrill simulate` asks a campaign for, arm by arm: its arms, plan, warnings, engines."""
    campaign.require_traffic()
    campaign.warnings()
    campaign.max_num_seqs()
    for arm in campaign.arms():
        simulation = kind_of(arm.engine).simulation(arm.engine)
        assert simulation is not None


def test_arms_built_once_per_load_and_the_same_objects(tmp_path: Path, builds: list[int]) -> None:
    campaign = load_campaign(_campaign(tmp_path))
    first = campaign.arms()
    _use_everything(campaign)
    again = campaign.arms()
    assert len(builds) == 1
    assert [a.name for a in first] == ["off-single", "fixed3-single", "dyn-single", "dyn-dp2"]
    assert all(a is b for a, b in zip(first, again, strict=True))
    again.pop()  # the caller's own list: the campaign's arms stay
    assert len(campaign.arms()) == 4
    load_campaign(_campaign(tmp_path)).arms()
    assert len(builds) == 2  # a new load builds its own


def test_a_copy_that_changes_what_arms_are_built_from_builds_its_own(tmp_path: Path, builds: list[int]) -> None:
    campaign = load_campaign(_campaign(tmp_path))
    arms = campaign.arms()
    moved = campaign.model_copy(update={"output": str(tmp_path / "elsewhere")})
    assert all(a is b for a, b in zip(moved.arms(), arms, strict=True)) and len(builds) == 1
    assert campaign == load_campaign(_campaign(tmp_path))  # the kept arms are not a field: equality holds
    assert len(builds) == 2  # the load compared with
    changed = campaign.model_copy(update={"policies": {"off": "off", "fixed3": "fixed:2", "dyn": DYN}})
    fixed = {a.name: a for a in changed.arms()}["fixed3-single"]
    assert fixed.policy.resolve(fixed.topology).num_speculative_tokens == 2
    kept = {a.name: a for a in campaign.arms()}["fixed3-single"]
    assert kept.policy.resolve(kept.topology).num_speculative_tokens == 3
    picked = campaign.model_copy(update={"arms_only": campaign.arms_only[:2] if campaign.arms_only else None})
    assert [a.name for a in picked.arms()] == ["off-single", "fixed3-single"]
    renamed = campaign.model_copy(update={"name": "other"})
    assert {a.campaign for a in renamed.arms()} == {"other"}
    assert len(builds) == 5


def test_the_profile_read_once_per_campaign_load(tmp_path: Path, profile_reads: list[Path]) -> None:
    own = _own_profile(tmp_path)
    path = _campaign(tmp_path, engine={"kind": "simulated", "profile": str(own)})
    parsed_before, _ = profile_parses()
    campaign = load_campaign(path)
    _use_everything(campaign)
    moved = campaign.model_copy(update={"output": str(tmp_path / "elsewhere")})
    _use_everything(moved)
    assert profile_reads == [own]
    assert profile_parses()[0] - parsed_before == 1
    _use_everything(load_campaign(path))  # another load reads the file again, and finds its content parsed
    assert profile_reads == [own, own]
    assert profile_parses()[0] - parsed_before == 1


def test_a_profile_changed_on_disk_is_read_again(tmp_path: Path) -> None:
    own = _own_profile(tmp_path)
    path = _campaign(tmp_path, engine={"kind": "simulated", "profile": str(own)})
    before = load_campaign(path)
    assert before.planned_arms().profile is not None
    hardware = before.planned_arms().profile.hardware
    own.write_text(own.read_text().replace(f"hardware: {hardware}", "hardware: my own GPU", 1))
    after = load_campaign(path)
    assert after.planned_arms().profile is not None
    assert after.planned_arms().profile.hardware == "my own GPU"
    assert before.planned_arms().profile.hardware == hardware  # a loaded campaign keeps what it was loaded with
    engine = after.arms()[0].engine
    simulation = kind_of(engine).simulation(engine)
    assert simulation is not None and simulation.profile.hardware == "my own GPU"
