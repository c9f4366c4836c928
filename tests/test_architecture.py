"""Package boundaries, checked on the source: each shared idea has one public home, so no module reaches into
another's private names, and the packages import each other in one direction only (the servers and the load
generator never need the orchestrator that drives them)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Which of our packages each may import. Acyclic by construction: every package only lists those below it.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "timebase": frozenset(),
    "serve_apps": frozenset({"timebase"}),
    "loadshapes": frozenset({"timebase"}),  # the servers' engines are not the load generator's business
    "orchestrator": frozenset({"timebase", "serve_apps", "loadshapes"}),
    "tests": frozenset({"timebase", "serve_apps", "loadshapes", "orchestrator"}),
    "benchmarks": frozenset({"timebase", "serve_apps", "loadshapes", "orchestrator", "tests"}),
}
OURS = frozenset(MAY_IMPORT)


def _sources() -> Iterator[tuple[str, Path, ast.Module]]:
    for package in sorted(OURS):
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path, ast.parse(path.read_text(), filename=str(path))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imports(tree: ast.Module) -> Iterator[tuple[int, str, list[ast.alias]]]:
    """(line, module, names) of every import of one of our modules, lazy ones inside functions included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in OURS:
                yield node.lineno, node.module, node.names
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    yield node.lineno, alias.name, [alias]


def _private_uses(path: Path, tree: ast.Module) -> Iterator[str]:
    where = path.relative_to(ROOT)
    bound: set[str] = set()  # local names bound to one of our modules or to something imported from one
    for line, module, names in _imports(tree):
        for alias in names:
            if module == alias.name:  # `import a.b [as c]`
                bound.add(alias.asname or module.split(".")[0])
            elif _private(alias.name):
                yield f"{where}:{line}: from {module} import {alias.name}"
            else:
                bound.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                yield f"{where}:{node.lineno}: {ast.unparse(node)}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr":
            # monkeypatch.setattr(module, "_name", ...) and monkeypatch.setattr("package.module._name", ...)
            args = node.args
            target = args[1] if len(args) > 1 and isinstance(args[0], ast.Name) and args[0].id in bound else None
            first = args[0].value if args and isinstance(args[0], ast.Constant) else None
            dotted = first.split(".") if isinstance(first, str) else [""]
            if isinstance(target, ast.Constant) and isinstance(target.value, str) and _private(target.value):
                yield f"{where}:{node.lineno}: {ast.unparse(node.func)}({ast.unparse(args[0])}, {target.value!r})"
            elif dotted[0] in OURS and any(_private(part) for part in dotted):
                yield f"{where}:{node.lineno}: {ast.unparse(node.func)}({'.'.join(dotted)!r})"


def test_no_module_uses_another_modules_private_names() -> None:
    found = [use for _, path, tree in _sources() for use in _private_uses(path, tree)]
    assert not found, "private names used outside their module (make them public or pass the data):\n" + "\n".join(
        found
    )


def test_packages_import_downward_only() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {package} imports {module}"
        for package, path, tree in _sources()
        for line, module, _ in _imports(tree)
        if (target := module.split(".")[0]) != package and target not in MAY_IMPORT[package]
    ]
    assert not found, "imports against the package layering (MAY_IMPORT):\n" + "\n".join(found)


def test_the_layering_is_acyclic() -> None:
    seen: list[str] = []
    remaining = dict(MAY_IMPORT)
    while remaining:
        ready = [p for p, deps in remaining.items() if deps <= set(seen)]
        assert ready, f"MAY_IMPORT has a cycle among {sorted(remaining)}"
        seen += ready
        for p in ready:
            del remaining[p]
