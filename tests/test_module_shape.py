"""The house's shape, checked on the source: small modules, and the unit loop's bookkeeping written once
(orchestrator/execute/runner.py), so that a new runner cannot grow its own resume or marker logic beside it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests import REPO as ROOT

PRODUCT = ("orchestrator", "serve_apps", "loadshapes", "timebase", "infra")
MAX_LINES = 450


def _modules() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def test_no_module_is_over_450_lines() -> None:
    long = [f"{p.relative_to(ROOT)}: {n}" for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (split them by idea):\n" + "\n".join(long)


def _calls(path: Path, names: frozenset[str]) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")) in names
    ]


_WRITES = re.compile(r"write|open|put|save|dump|copy|move|rename")


def _marker_writes(path: Path) -> list[str]:
    """Calls that write a unit's marker: a write-like call (write_json today; write_text, open, put, copy, move or
    rename tomorrow) given `<store>.unit_marker(...)` as its path."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:100]}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _WRITES.search(ast.unparse(node.func).rpartition(".")[2])
        and node.args
        and isinstance(first := node.args[0], ast.Call)
        and (first.func.attr if isinstance(first.func, ast.Attribute) else getattr(first.func, "id", ""))
        == "unit_marker"
    ]


RUNNER = ROOT / "orchestrator" / "execute" / "runner.py"
MANIFEST = ROOT / "orchestrator" / "rundir" / "manifest.py"


def test_the_unit_loops_bookkeeping_lives_in_the_runner_only() -> None:
    """Removing a partial unit and recording a unit done (its marker, then its manifest entry) are called from the
    unit loop only, and a marker is written in one place, record_unit. (Reading whether a unit is complete is also
    the report's and the CLI's business, so it is not in the list.)"""
    writes = frozenset({"remove_partial", "record_unit"})
    found = [c for p in _modules() if p != RUNNER for c in _calls(p, writes) if "def " not in c]
    assert not found, "the unit loop's bookkeeping outside orchestrator/execute/runner.py:\n" + "\n".join(found)
    assert _calls(RUNNER, writes), "runner.py no longer does it: update this test"
    markers = [w for p in _modules() for w in _marker_writes(p)]
    assert len(markers) == 1 and markers[0].startswith("orchestrator/rundir/manifest.py"), (
        "a unit's marker is written only by record_unit (orchestrator/rundir/manifest.py):\n" + "\n".join(markers)
    )
