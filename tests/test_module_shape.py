"""The house's shape, checked on the source: small modules, and the unit loop's bookkeeping written once
(orchestrator/execute/runner.py), so that a new runner cannot grow its own resume or marker logic beside it."""

from __future__ import annotations

import ast
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


def test_the_unit_loops_bookkeeping_lives_in_the_runner_only() -> None:
    """Removing a partial unit, writing a unit's marker and recording it in the manifest: one place. (Reading
    whether a unit is complete is also the report's and the CLI's business, so it is not in the list.)"""
    writes = frozenset({"remove_partial", "record_unit", "write_marker"})
    found = [c for p in _modules() if p.name != "runner.py" for c in _calls(p, writes) if "def " not in c]
    assert not found, "the unit loop's bookkeeping outside orchestrator/execute/runner.py:\n" + "\n".join(found)
    assert _calls(ROOT / "orchestrator" / "execute" / "runner.py", writes), "runner.py no longer does it: update this test"
