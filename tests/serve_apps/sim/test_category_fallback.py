"""A request's category without acceptance of its own in the profile uses the one the profile names for it
(category_map, else default_category), graded on the drafts the engine accepts; with neither, one clear error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from pydantic import ValidationError

from loadshapes.arrivals import poisson_arrivals
from loadshapes.mixes import builtin_workload
from orchestrator.virtual.experiments import make_requests
from serve_apps.policies import SINGLE, FixedPolicy
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile, load_profile
from serve_apps.sim.virtual import run_open_loop


def _first_position_rate(profile: Profile, category: str) -> float:
    """Accepted / drafted at draft position 1 over a k = 1 run of `category` requests: the profile's p_1 for the
    acceptance the engine used, within sampling error."""
    requests = make_requests(builtin_workload("chat"), poisson_arrivals(8, 30, seed=5), seed=6)
    requests = [dataclasses.replace(r, category=category) for r in requests]
    core = EngineCore(profile, FixedPolicy(method="eagle", model="d", k=1).resolve(SINGLE), seed=7)
    run = run_open_loop(core, requests)
    drafted = sum(int(r.step_drafted.sum()) for r in run.records)
    accepted = sum(int(r.step_accepted.sum()) for r in run.records)
    assert drafted > 5000
    return accepted / drafted


def test_shipped_eagle_profile_names_its_fallbacks() -> None:
    profile = load_profile("llama3.1-8b-h100-eagle")
    assert profile.resolve_category("chat") == "chat"
    assert profile.resolve_category("math_reasoning") == "reasoning"
    assert profile.resolve_category("coding") == "chat"  # the default: no published per-position figure
    assert load_profile("llama3.1-8b-h100-ngram").resolve_category("sharegpt") == "chat"


@pytest.mark.parametrize(("category", "used"), [("math_reasoning", "reasoning"), ("coding", "editing")])
def test_a_category_without_acceptance_drafts_as_its_fallback(category: str, used: str) -> None:
    base = load_profile("llama3.1-8b-h100-eagle")
    # editing (0.8) and reasoning (0.7) apart from chat (0.68) by more than the ~0.006 sampling error of ~6000 drafts
    profile = base.model_validate(
        {**base.model_dump(), "category_map": {"math_reasoning": "reasoning"}, "default_category": "editing"}
    )
    want = profile.acceptance[used].per_position[0]
    got = _first_position_rate(profile, category)
    assert abs(got - want) < 4 * np.sqrt(want * (1 - want) / 5000), (category, got, want)


def test_without_a_fallback_the_category_is_refused_by_name() -> None:
    base = load_profile("llama3.1-8b-h100-eagle")
    bare = base.model_validate({**base.model_dump(), "category_map": {}, "default_category": None})
    with pytest.raises(KeyError, match=r"no acceptance for workload category 'coding'.*default_category"):
        _first_position_rate(bare, "coding")


def test_a_fallback_must_name_a_category_the_profile_has() -> None:
    base = load_profile("llama3.1-8b-h100-eagle").model_dump()
    with pytest.raises(ValidationError, match="default_category = 'code'"):
        Profile.model_validate({**base, "default_category": "code"})
    with pytest.raises(ValidationError, match=r"category_map\.math = 'maths'"):
        Profile.model_validate({**base, "category_map": {"math": "maths"}})
