"""Campaign files fuzzed: each is accepted or refused with one line naming what is wrong, never a traceback."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.plan.campaign import CampaignError, load_campaign
from tests.orchestrator.virtual.test_campaign_run import BASE

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["off", "fixed:3", "dynamic:3:1-4=3,5-512=0", "single", "data_parallel:2", "quiet", "chat"]),
    st.lists(st.integers(-5, 600), max_size=4),
    # magnitudes a plan may not be built from (rates, durations, lengths, users, repeats): sized, never built
    st.builds(lambda e, m: m * 10.0**e, st.integers(-3, 15), st.floats(1, 9.99)),
    st.builds(lambda e: 10**e, st.integers(3, 15)),
    st.dictionaries(st.text(max_size=6), st.integers(-3, 50), max_size=3),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_paths(value, (*prefix, i)))
    return found


PATHS = _paths(BASE)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["replace", "delete", "unknown"]))
            if action == "replace":
                parent[path[-1]] = draw(VALUES)
            elif action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=8))] = draw(VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced this path
    return data


@given(mutated())
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_campaigns_are_accepted_or_refused_in_one_line(tmp_path: Path, data: dict[str, Any]) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        campaign = load_campaign(path)
    except CampaignError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"campaign {path}"), message
        assert "Traceback" not in message
        return
    assert campaign.arms()  # accepted: usable
    try:  # what run and simulate check before writing anything: the plan's size (analytic, never materialised)
        campaign.require_traffic()
    except CampaignError as exc:
        assert "\n" not in str(exc), str(exc)
