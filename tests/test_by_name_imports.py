"""No import the import walk cannot see. The layering and circle tests (tests/test_architecture.py) read `import`
statements; a module loaded by name (importlib, __import__, a spec from a file, pkgutil, an entry point, a module path
in a string) would dodge both. In the product such a load is refused, except what BY_NAME_ALLOWED names with its
reason, and a by-name load of one of our own modules is never allowed: import it plainly."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests import REPO as ROOT
from tests.test_architecture import module_files

PRODUCT = ("orchestrator", "serve_apps", "loadshapes", "timebase", "infra")
OURS = ("orchestrator", "serve_apps", "loadshapes", "timebase", "infra", "tools", "tests", "benchmarks")

# Calls that load a module by name or by file, by their full dotted name however they were imported.
LOADERS = frozenset(
    {
        "__import__", "builtins.__import__", "importlib.__import__", "importlib.import_module", "importlib.reload",
        "importlib.util.find_spec", "importlib.util.spec_from_file_location", "importlib.util.spec_from_loader",
        "importlib.util.module_from_spec", "importlib.machinery.SourceFileLoader", "importlib.metadata.entry_points",
        "pkg_resources.iter_entry_points", "pkg_resources.load_entry_point", "runpy.run_module", "runpy.run_path",
        "zipimport.zipimporter",
    }
)  # fmt: skip
# Modules whose whole business is finding or running modules by name: importing them at all is the load.
LOADER_MODULES = ("pkgutil", "runpy", "pkg_resources", "zipimport")

# (file, what was found) -> why it may stay. Only for what is not ours: an optional dependency probed by name.
# Empty today: vLLM's presence is read from its distribution's metadata (importlib.metadata.version), which
# loads no module.
BY_NAME_ALLOWED: dict[tuple[str, str], str] = {}

_OUR_PATH = re.compile(r"^(?:" + "|".join(OURS) + r")(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?$")


def _bindings(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from every import in the module."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([bound.get(node.id, node.id), *reversed(parts)])


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _ours(text: str, modules: dict[str, Path], *, files: bool = False) -> bool:
    """A string that names one of our modules (`pkg.mod`, `pkg.mod.name`, `pkg.mod:attr`; with `files`, its file:
    a loader's argument, where a sentence naming a file is not)."""
    if files and text.endswith(".py"):
        return text.split("/")[0] in OURS and (ROOT / text).is_file()
    if not _OUR_PATH.match(text):
        return False
    name = text.split(":")[0]
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return bool(name)


def by_name_loads(tree: ast.Module, modules: dict[str, Path]) -> list[tuple[int, str, bool]]:
    """(line, what, names one of our modules) for every by-name load and every module path in a string."""
    bound = _bindings(tree)
    skip = _docstrings(tree)
    found: list[tuple[int, str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [(node.lineno, f"import {n}", False) for n in names if n.split(".")[0] in LOADER_MODULES]
        elif isinstance(node, ast.Call) and (called := _dotted(node.func, bound)) is not None:
            if called in LOADERS or called.split(".")[0] in LOADER_MODULES:
                strings = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                skip.update(id(a) for a in strings)  # the call's finding names them
                named = [str(a.value) for a in strings]
                what = f"{called}({', '.join(map(repr, named))})" if named else called
                found.append((node.lineno, what, any(_ours(n, modules, files=True) for n in named)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            # A module path kept for later (Ray Serve's import_path, a table of plugins) is loaded by name too.
            found += (
                [(node.lineno, f"module path in a string {node.value!r}", True)] if _ours(node.value, modules) else []
            )
    return found


def _found() -> list[tuple[str, int, str, bool]]:
    modules = module_files(ROOT, OURS)
    return [
        (str(path.relative_to(ROOT)), line, what, ours)
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, what, ours in by_name_loads(ast.parse(path.read_text(), filename=str(path)), modules)
    ]


def test_the_product_loads_no_module_by_name() -> None:
    found = _found()
    ours = [f"{path}:{line}: {what}" for path, line, what, mine in found if mine]
    assert not ours, "our modules loaded by name (import them plainly; a circle is fixed, not dodged):\n" + "\n".join(
        ours
    )
    unexplained = [f"{path}:{line}: {what}" for path, line, what, _ in found if (path, what) not in BY_NAME_ALLOWED]
    assert not unexplained, "modules loaded by name (import them, or add them to BY_NAME_ALLOWED with why):\n" + (
        "\n".join(unexplained)
    )
    stale = sorted(set(BY_NAME_ALLOWED) - {(path, what) for path, _, what, _ in found})
    assert not stale, f"BY_NAME_ALLOWED names loads that are gone: {stale}"


def test_every_spelling_of_a_by_name_load_is_found() -> None:
    # Graded on a source whose loads are known, one a line (line 1 holds the imports).
    source = "\n".join([
        "import importlib, importlib.util as iu, pkgutil; from importlib import import_module as load; "
        "from importlib.metadata import entry_points, version",
        "importlib.import_module('serve_apps.engines.vllm_engine')",
        "load('vllm')",
        "__import__('orchestrator.logs')",
        "iu.find_spec('vllm')",
        "importlib.util.spec_from_file_location('x', 'serve_apps/arms.py')",
        "entry_points(group='specdrill.kinds')",
        "pkgutil.iter_modules()",
        "TARGET = 'serve_apps.deployment:app'",
        "version('vllm')",
        "'docs mention serve_apps.arms in a sentence'",
    ])  # fmt: skip
    modules = module_files(ROOT, OURS)
    found = {line: (what, ours) for line, what, ours in by_name_loads(ast.parse(source), modules)}
    assert found == {
        1: ("import pkgutil", False),
        2: ("importlib.import_module('serve_apps.engines.vllm_engine')", True),
        3: ("importlib.import_module('vllm')", False),
        4: ("__import__('orchestrator.logs')", True),
        5: ("importlib.util.find_spec('vllm')", False),
        6: ("importlib.util.spec_from_file_location('x', 'serve_apps/arms.py')", True),
        7: ("importlib.metadata.entry_points", False),
        8: ("pkgutil.iter_modules", False),
        9: ("module path in a string 'serve_apps.deployment:app'", True),
    }
