"""orchestrator.execute.runner: one unit loop for run, simulate and search; an adaptive source sees each result
before it names the next unit."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import yaml

from orchestrator.execute.runner import Group, Work, run_units
from orchestrator.plan.campaign import Campaign
from orchestrator.rundir.layout import RunStore, Unit
from orchestrator.rundir.manifest import open_run
from orchestrator.virtual.campaign import simulate_campaign
from orchestrator.virtual.executor import VIRTUAL_EPOCH_NS, VirtualExecutor
from tests import REPO
from tests.tiny_campaigns import two_shapes


def _campaign(tmp_path: Path, name: str) -> Campaign:
    data = yaml.safe_load(two_shapes(name))
    return Campaign.model_validate({**data, "output": str(tmp_path / name)})


def test_an_adaptive_source_sees_each_result_before_it_names_the_next_unit(tmp_path: Path) -> None:
    campaign = _campaign(tmp_path, "adaptive")
    store = RunStore(campaign.output_dir())
    manifest = open_run(campaign, store, mode="virtual")
    manifest["virtual_epoch_ns"] = VIRTUAL_EPOCH_NS
    off, dyn = campaign.arms()
    seen: list[int] = []

    def units() -> Iterator[Work]:
        yield Work(campaign, off, Unit(arm=off.name, shape="ramp", repeat=0))
        seen.append(len(group.results))
        # The next unit depends on the first one's result: the shape with as many requests as it sent is ramp.
        shape = "ramp" if group.results[0].scheduled > 0 else "calm"
        yield Work(campaign, dyn, Unit(arm=dyn.name, shape=shape, repeat=0))
        seen.append(len(group.results))

    group = Group(campaign, [off, dyn], [])
    group.units = units()
    run_units([group], VirtualExecutor(), store=store, manifest=manifest)
    assert seen == [1, 2]
    assert [r.unit.key for r in group.results] == [
        Unit(arm=off.name, shape="ramp", repeat=0).key,
        Unit(arm=dyn.name, shape="ramp", repeat=0).key,
    ]
    # The reference: the same units run by the campaign's own loop (fixed slots, every unit) send and keep the
    # same requests, whatever the order and the slots.
    _, ref_manifest = simulate_campaign(_campaign(tmp_path, "reference"))
    for result in group.results:
        assert store.is_complete(result.unit)
        expected = ref_manifest["units"][result.unit.key]
        assert (result.scheduled, result.rows) == (expected["scheduled"], expected["rows"])
        assert result.scheduled > 0
    assert manifest["finished_ns"] > 0
    assert sorted(manifest["units"]) == sorted(r.unit.key for r in group.results)
    assert not store.is_complete(Unit(arm=off.name, shape="calm", repeat=0))


def test_the_partial_removal_and_the_signal_check_have_one_home() -> None:
    """Resume and interrupts live once: only the runner removes a partial unit, whatever runner runs the unit (the
    marker's one home is checked by tests/test_module_shape.py)."""
    callers: dict[str, set[str]] = {"remove_partial": set(), "raise_pending": set()}
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name in callers:
                callers[name].add(str(path.relative_to(REPO)))
    assert callers["remove_partial"] == {"orchestrator/execute/runner.py"}
    # A unit's signal check is the runner's; the load workers' wait checks for a stop once a second.
    assert callers["raise_pending"] == {
        "orchestrator/execute/runner.py", "orchestrator/execute/interrupts.py", "orchestrator/execute/load_workers.py"
    }  # fmt: skip
