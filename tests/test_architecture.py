"""Package boundaries, checked on the source: each shared idea has one public home, so no module reaches into
another's private names, and the packages import each other in one direction only (the servers and the load
generator never need the orchestrator that drives them)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests import REPO as ROOT

# Which of our packages each may import. Acyclic by construction: every package only lists those below it.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "timebase": frozenset(),
    "serve_apps": frozenset({"timebase"}),
    "loadshapes": frozenset({"timebase"}),  # the servers' engines are not the load generator's business
    "orchestrator": frozenset({"timebase", "serve_apps", "loadshapes"}),
    "tools": frozenset({"timebase", "serve_apps", "loadshapes", "orchestrator"}),  # development tools, not installed
    "tests": frozenset({"timebase", "serve_apps", "loadshapes", "orchestrator", "tools"}),
    "benchmarks": frozenset({"timebase", "serve_apps", "loadshapes", "orchestrator", "tools", "tests"}),
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


# Module circles, inside a package as between them: every import counts (module level, inside functions, under
# TYPE_CHECKING: a circle dodged by a late import is still two modules that need each other), relative imports
# resolved, and a circle is named with its path so the fix can start from the edge that should not be there.
PRODUCT = ("orchestrator", "loadshapes", "serve_apps", "infra", "timebase")


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages (a package is its __init__.py)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of the modules (`a.b.func` -> `a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports, among `modules` only."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        # A relative import counts from the module's package: the module itself when it is an __init__.py
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(_known(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package[: len(package) - (node.level - 1)], *([base] if base else [])])
                # `from pkg import name`: the submodule pkg.name where there is one, else pkg itself
                targets.update(_known(f"{base}.{alias.name}", modules) for alias in node.names)
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module: each member reaches every other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative: the graph's depth is not Python's to limit
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return components


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per tangle, as a path that returns to its start."""
    return [_path_through(component, graph) for component in tangles(graph)]


def _path_through(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest circle from the component's first module back to it, inside the component."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not a circle")  # a strongly connected component always is


def test_no_import_circles_among_the_products_modules() -> None:
    graph = import_graph(module_files(ROOT, PRODUCT))
    found = [
        " -> ".join(_path_through(tangle, graph)) + (f" (one of the circles among {', '.join(sorted(tangle))})"
                                                      if len(tangle) > 2 else "")
        for tangle in tangles(graph)
    ]  # fmt: skip
    assert not found, "import circles (move what both sides need below both):\n" + "\n".join(found)


def test_the_walk_finds_a_circle_through_a_late_relative_import(tmp_path: Path) -> None:
    # The walker graded on a package whose circle is known: a -> b at module level, b -> a inside a function
    # through a relative import, c importing both (no circle of its own), d importing a name from a.
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import b\n")
    (package / "a.py").write_text("from pkg.sub import b\n\nVALUE = 1\n")
    (package / "sub" / "b.py").write_text("def late():\n    from ..a import VALUE\n    return VALUE\n")
    (package / "c.py").write_text("import pkg.a\nfrom pkg.sub import b\n")
    (package / "d.py").write_text("from pkg.a import VALUE\n")
    modules = module_files(tmp_path, ("pkg",))
    graph = import_graph(modules)
    assert graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.sub"] == {"pkg.sub.b"}
    assert graph["pkg.c"] == {"pkg.a", "pkg.sub.b"} and graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.a"]]
    (package / "sub" / "b.py").write_text("def late():\n    return 1\n")
    assert cycles(import_graph(modules)) == []


# Inside orchestrator, its folders in the flow's order, lowest first: a module imports only from its own layer and
# the layers before it. The campaign and its plan; the run directory (its files' data models, read by the analysis
# and written by the executors, so it imports no runtime); the analysis of a run (its reading, the operating map,
# steps and fits, verification, then the answer and summary.json built on them); the executors (real time, then
# virtual time, which reuses the loop); the decisions, the calibration and the search that run and read them; the
# report, the comparison of two runs (which draws with the report's charts), the docs generator and the command
# line that present them. Every module of orchestrator belongs to exactly one layer: a root module is named itself,
# any other by its folder, every folder (nested ones too) by its own name, so a new folder fails until placed.
ORCHESTRATOR_LAYERS: tuple[tuple[str, ...], ...] = (
    ("orchestrator", "orchestrator.logs", "orchestrator.numfmt"),  # the package and its utilities
    ("orchestrator.plan",),
    ("orchestrator.rundir",),
    ("orchestrator.analysis.read",),
    ("orchestrator.analysis.opmap",),
    ("orchestrator.analysis.steps",),
    ("orchestrator.analysis.verify",),
    ("orchestrator.analysis",),
    ("orchestrator.execute",),
    ("orchestrator.virtual",),
    ("orchestrator.decide.recommend",),
    ("orchestrator.decide",),
    ("orchestrator.decide.tune",),
    ("orchestrator.calibrate",),
    ("orchestrator.search",),
    ("orchestrator.report.html",),
    ("orchestrator.report",),
    ("orchestrator.compare",),
    ("orchestrator.cli",),
    ("orchestrator.entry",),
)


def orchestrator_layer(module: str, path: Path, layers: tuple[tuple[str, ...], ...]) -> int | None:
    """The index of the module's layer: a root module's own name, else its folder's (a package is its own folder);
    None when neither is listed."""
    index = {name: i for i, layer in enumerate(layers) for name in layer}
    folder = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if folder.count(".") == 0:  # orchestrator/__init__.py and the root's modules: named one by one
        return index.get(module)
    return index.get(folder)


def layer_breaches(root: Path, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every module without a layer, and every import (module level, in a function, under TYPE_CHECKING, relative
    or absolute) of a module in a later layer."""
    modules = module_files(root, ("orchestrator",))
    graph = import_graph(modules)
    layer = {module: orchestrator_layer(module, path, layers) for module, path in modules.items()}
    found = [f"{modules[m].relative_to(root)}: {m} is in no layer of ORCHESTRATOR_LAYERS" for m, i in layer.items()
             if i is None]  # fmt: skip
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            mine, theirs = layer[module], layer[target]
            if mine is not None and theirs is not None and theirs > mine:
                found.append(
                    f"{modules[module].relative_to(root)}: {module} (layer {mine}: {', '.join(layers[mine])}) imports "
                    f"{target} (layer {theirs}: {', '.join(layers[theirs])}), a later one"
                )
    return found


def test_orchestrators_folders_import_in_the_flows_order() -> None:
    found = layer_breaches(ROOT, ORCHESTRATOR_LAYERS)
    assert not found, "imports against orchestrator's folder order (ORCHESTRATOR_LAYERS, lowest first):\n" + "\n".join(
        found
    )


def test_every_layer_names_a_folder_or_module_that_exists() -> None:
    modules = module_files(ROOT, ("orchestrator",))
    stale = [name for layer in ORCHESTRATOR_LAYERS for name in layer if name not in modules]
    names = [name for layer in ORCHESTRATOR_LAYERS for name in layer]
    assert not stale, f"ORCHESTRATOR_LAYERS names what is gone: {stale}"
    assert len(names) == len(set(names)), "a name in two layers"


def test_the_folder_order_catches_every_spelling_of_an_import_upward(tmp_path: Path) -> None:
    # Graded on a package whose breaches are known: low imports high in a function, under TYPE_CHECKING and
    # through a relative import; high imports low (allowed); a nested folder nobody placed.
    package = tmp_path / "orchestrator"
    for folder in ("low", "high", "high/deep"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "high" / "top.py").write_text("from orchestrator.low import base\n")
    (package / "low" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from orchestrator.high.top import X\n"
        "def late():\n    import orchestrator.high.top\n    from ..high import top\n"
    )
    layers = (("orchestrator",), ("orchestrator.low",), ("orchestrator.high",))
    found = layer_breaches(tmp_path, layers)
    assert sum("orchestrator.low.base (layer 1" in f and "imports orchestrator.high.top" in f for f in found) == 1
    assert [f for f in found if "in no layer" in f] == [
        "orchestrator/high/deep/__init__.py: orchestrator.high.deep is in no layer of ORCHESTRATOR_LAYERS"
    ]
    (package / "low" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import orchestrator.high\n"
    )
    assert any("imports orchestrator.high (layer 2" in f for f in layer_breaches(tmp_path, layers))
    (package / "low" / "base.py").write_text("def late():\n    from ..high import top\n")
    assert any("imports orchestrator.high.top" in f for f in layer_breaches(tmp_path, layers))
    (package / "low" / "base.py").write_text("X = 1\n")
    assert [f for f in layer_breaches(tmp_path, layers) if "in no layer" not in f] == []


# A folder a reader can take in at a glance: the flow is in the folders, not in a long listing.
MAX_ROOT_MODULES = 6
MAX_FOLDER_MODULES = 20


def folder_sizes(root: Path) -> dict[str, int]:
    """Modules per folder of orchestrator/ (its __init__.py aside), the root included."""
    return {
        str(folder.relative_to(root)): len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
        for folder in [root / "orchestrator", *sorted(p.parent for p in (root / "orchestrator").rglob("*/__init__.py"))]
    }


def test_orchestrators_root_and_folders_stay_small() -> None:
    sizes = folder_sizes(ROOT)
    assert sizes["orchestrator"] <= MAX_ROOT_MODULES, f"orchestrator/ holds {sizes['orchestrator']} modules: file them"
    big = {folder: n for folder, n in sizes.items() if n > MAX_FOLDER_MODULES}
    assert not big, f"folders over {MAX_FOLDER_MODULES} modules (split them by idea): {big}"


def test_the_size_check_counts_nested_folders(tmp_path: Path) -> None:
    (tmp_path / "orchestrator" / "a" / "b").mkdir(parents=True)
    for folder, count in (("orchestrator", 2), ("orchestrator/a", 0), ("orchestrator/a/b", 21)):
        (tmp_path / folder / "__init__.py").write_text("")
        for i in range(count):
            (tmp_path / folder / f"m{i}.py").write_text("")
    assert folder_sizes(tmp_path) == {"orchestrator": 2, "orchestrator/a": 0, "orchestrator/a/b": 21}
