"""Test tiers (tests/conftest.py): every test has exactly one of unit, integration and vllm, and no unit test
reaches Ray, Serve, vLLM, a server or a child process, through its own code, its helpers or its fixtures.

The suite-wide checks read what this session collected, so they need the whole of tests/ collected (`make
test-fast` and `make test` do; deselected tests count). Run on its own, this module checks only the detector.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import TESTS
from tests.conftest import (
    COLLECTED,
    INTEGRATION_NAMES,
    LONGEST_FIRST,
    SLOW,
    TIERS,
    VLLM_FIXTURES,
    VLLM_NAMES,
    detected_tier,
    fixture_functions,
    reached_names,
)

# Modules whose every test starts Ray, Serve or vLLM: the detector has to see it (a check of the detector).
ALL_NON_UNIT = ("test_serve_sim.py", "test_job_submit.py", "test_multinode.py", "test_serve_vllm.py",
                "test_vllm_data_parallel.py", "test_endpoint_vllm.py", "test_engine_kill.py", "test_multinode_vllm.py",
                "test_search_ray.py")  # fmt: skip


def _suite(request: pytest.FixtureRequest) -> list[pytest.Item]:
    items = request.config.stash.get(COLLECTED, [])
    collected = {Path(str(item.path)).name for item in items}
    missing = sorted({path.name for path in TESTS.rglob("test_*.py")} - collected)
    if missing:
        pytest.skip(f"the whole of tests/ was not collected (missing {', '.join(missing[:3])}...): make test-fast")
    return items


def _tiers(item: pytest.Item) -> list[str]:
    return sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})


def test_every_test_has_exactly_one_tier(request: pytest.FixtureRequest) -> None:
    wrong = [f"{item.nodeid}: {_tiers(item) or 'none'}" for item in _suite(request) if len(_tiers(item)) != 1]
    assert not wrong, "tests without exactly one tier:\n" + "\n".join(wrong)


def test_no_unit_test_reaches_ray_vllm_a_server_or_a_process(request: pytest.FixtureRequest) -> None:
    suspicious = INTEGRATION_NAMES | VLLM_NAMES
    wrong = []
    for item in _suite(request):
        if _tiers(item) != ["unit"]:
            continue
        if VLLM_FIXTURES & set(item.fixturenames):
            wrong.append(f"{item.nodeid}: uses {sorted(VLLM_FIXTURES & set(item.fixturenames))}")
        for func in fixture_functions(item):
            found = reached_names([func]) & suspicious
            if found:
                wrong.append(f"{item.nodeid}: its fixture {func.__name__} reaches {sorted(found)}")
        tier, why = detected_tier(item)
        if tier != "unit":
            wrong.append(f"{item.nodeid}: marked unit, but reaches {sorted(why)} ({tier})")
    assert not wrong, "unit tests that are not:\n" + "\n".join(wrong)


def test_the_modules_that_start_ray_or_vllm_have_no_unit_test(request: pytest.FixtureRequest) -> None:
    items = _suite(request)
    for module in ALL_NON_UNIT:
        tiers = {tuple(_tiers(item)) for item in items if Path(str(item.path)).name == module}
        assert tiers and ("unit",) not in tiers, f"{module}: {tiers}"


def test_every_slow_entry_names_collected_tests(request: pytest.FixtureRequest) -> None:
    items = _suite(request)
    for prefix in SLOW:
        matched = [item for item in items if item.nodeid.startswith(prefix)]
        assert matched, f"SLOW entry {prefix!r} matches no test"
        assert all(item.get_closest_marker("slow") for item in matched)


def test_every_longest_first_entry_names_a_collected_module(request: pytest.FixtureRequest) -> None:
    # A module moved or renamed would silently lose its early place under -n, and its worker would finish last.
    modules = {item.nodeid.split("::", 1)[0] for item in _suite(request)}
    assert [module for module in LONGEST_FIRST if module not in modules] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_not_vllm_collects_on_a_machine_without_vllm() -> None:
    """docs/engineering/testing.md: `-m "not vllm"` on a machine without the vLLM CPU build. The suite is collected with
    `import vllm` failing (tests/no_vllm.py): no module may need vLLM to be imported, and every test left after
    `-m "not vllm"` is one that does not reach it (~9 s: the collection imports every test module)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "tests.no_vllm",
         "-m", "not vllm", str(TESTS)],
        capture_output=True, text=True, timeout=300, check=False, cwd=TESTS.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(collected) > 300 and not any("test_vllm_policies.py" in line for line in collected)
    assert "deselected" in done.stdout.splitlines()[-1]


# --- the detector, on functions of its own ---------------------------------------------------------------------


def _spawns() -> None:
    subprocess.run(["true"], check=True)


def _calls_a_helper_that_spawns() -> None:
    _spawns()


class _Starts:
    def go(self) -> None:
        from tests.ray_helpers import local_ray

        with local_ray():
            pass


def _uses_a_class_that_starts_ray() -> None:
    _Starts().go()


def _imports_vllm() -> Any:
    import vllm

    return vllm


def _pure(x: int) -> int:
    return sorted([x, 1])[0]


# Reached through a dict, which the detector does not follow, so that this test itself stays unit.
SAMPLES = {"helper": _calls_a_helper_that_spawns, "class": _uses_a_class_that_starts_ray, "vllm": _imports_vllm,
           "pure": _pure}  # fmt: skip


def test_the_detector_follows_helpers_classes_and_imports() -> None:
    assert "subprocess" in reached_names([SAMPLES["helper"]])
    assert "local_ray" in reached_names([SAMPLES["class"]])
    assert "vllm" in reached_names([SAMPLES["vllm"]])
    assert not reached_names([SAMPLES["pure"]]) & (INTEGRATION_NAMES | VLLM_NAMES)


# Every way a test function imports vLLM (issue 40: `from vllm.x import y` names only "vllm.x" and "y", so a test
# importing that way counted as unit and skipped under `make test-fast`). Never called: vLLM is not installed here.
def _import_vllm_submodule() -> Any:
    import vllm.engine.arg_utils

    return vllm.engine.arg_utils


def _from_vllm_import() -> Any:
    from vllm import SamplingParams

    return SamplingParams


def _from_vllm_submodule_import() -> Any:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs


def _import_module_vllm() -> Any:
    import importlib

    return importlib.import_module("vllm.config")


def _importorskip_vllm() -> Any:
    return pytest.importorskip("vllm")


def _dunder_import_vllm() -> Any:
    return __import__("vllm.v1.engine")


def _names_vllm_in_data() -> dict[str, str]:
    # The string alone is no import: a campaign of kind vllm is built and validated without vLLM.
    return {"kind": "vllm", "model": "m"}


VLLM_IMPORTS = {"import vllm": _imports_vllm, "import vllm.x": _import_vllm_submodule,
                "from vllm import": _from_vllm_import, "from vllm.x import": _from_vllm_submodule_import,
                "importlib.import_module": _import_module_vllm, "pytest.importorskip": _importorskip_vllm,
                "__import__": _dunder_import_vllm}  # fmt: skip


@pytest.mark.parametrize("form", sorted(VLLM_IMPORTS))
def test_every_form_of_vllm_import_makes_a_vllm_test(form: str) -> None:
    assert "vllm" in reached_names([VLLM_IMPORTS[form]]) & VLLM_NAMES


SAMPLES_DATA = {"data": _names_vllm_in_data}


def test_the_string_vllm_outside_an_import_is_no_import() -> None:
    assert not reached_names([SAMPLES_DATA["data"]]) & VLLM_NAMES


def test_a_test_that_imports_from_a_vllm_submodule_is_in_the_vllm_tier() -> None:
    """tests/serve_apps/test_placement_plan.py reads vLLM's EngineArgs (`from vllm.engine.arg_utils import`): unit
    until issue 40, so `make test-fast` skipped it and `make test`'s vLLM tier never ran it."""
    from tests.serve_apps import test_placement_plan

    function = test_placement_plan.test_owned_engine_kwargs_are_fields_of_vllms_engine_args
    assert "vllm" in reached_names([function])
