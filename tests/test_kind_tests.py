"""An engine's kind is asked of the registry (serve_apps/engine_kinds: `kind_of(config)` and its capability flags),
never tested outside it: a kind tested by name or class in a runner is a place a new kind silently falls through.
Read on the syntax tree, so every spelling counts: `x.kind == "vllm"`, `x["kind"] ==`, `x.get("kind") !=`, the
name on the left, `in ("vllm", ...)`, a match on the kind or on a kind's config class, isinstance/issubclass or
`type(x) is` against a kind's config class."""

from __future__ import annotations

import ast

from serve_apps.engine_kinds.base import EngineConfigBase
from serve_apps.engine_kinds.registry import kinds
from tests import REPO as ROOT

SCANNED = ("orchestrator", "serve_apps", "loadshapes", "timebase", "infra", "tools", "benchmarks")
REGISTRY = ROOT / "serve_apps" / "engine_kinds"


def _kind_names() -> frozenset[str]:
    return frozenset(kinds())


def _config_classes() -> frozenset[str]:
    return frozenset({kind.config.__name__ for kind in kinds().values()} | {EngineConfigBase.__name__})


def _is_kind(node: ast.expr) -> bool:
    """An expression that reads a kind: `.kind`, `["kind"]`, `.get("kind", ...)`, a name `kind` or `*_kind`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind"
    return isinstance(node, ast.Name) and (node.id == "kind" or node.id.endswith("_kind"))


def _names_a_kind(node: ast.expr, names: frozenset[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_kind(e, names) for e in node.elts)
    return False


def _class_name(node: ast.expr) -> str:
    return ast.unparse(node).rsplit(".", 1)[-1]


def _matches_a_kind(subject: ast.expr, pattern: ast.pattern, names: frozenset[str], configs: frozenset[str]) -> bool:
    for part in ast.walk(pattern):
        if isinstance(part, ast.MatchValue) and _is_kind(subject) and _names_a_kind(part.value, names):
            return True
        if isinstance(part, ast.MatchClass) and _class_name(part.cls) in configs:
            return True
    return False


def kind_tests(tree: ast.Module, names: frozenset[str], configs: frozenset[str]) -> list[tuple[int, str]]:
    """(line, code) of every test of an engine kind by its name or its config class."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            by_name = any(map(_is_kind, sides)) and any(_names_a_kind(s, names) for s in sides)
            by_type = any(isinstance(op, ast.Is | ast.IsNot | ast.Eq | ast.NotEq) for op in node.ops) and any(
                isinstance(s, ast.Call) and ast.unparse(s.func) == "type" for s in sides
            ) and any(_class_name(s) in configs for s in sides)  # fmt: skip
            if by_name or by_type:
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            against = node.args[1]
            classes = against.elts if isinstance(against, ast.Tuple) else [against]
            if any(_class_name(c) in configs for c in classes):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match):
            for case in node.cases:
                if _matches_a_kind(node.subject, case.pattern, names, configs):
                    found.append(
                        (case.pattern.lineno, f"match {ast.unparse(node.subject)}: case {ast.unparse(case.pattern)}")
                    )
    return sorted(found)


def test_engine_kinds_are_told_apart_only_in_the_registry() -> None:
    names, configs = _kind_names(), _config_classes()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for package in SCANNED
        for path in sorted((ROOT / package).rglob("*.py"))
        if REGISTRY not in path.parents
        for line, code in kind_tests(ast.parse(path.read_text(), filename=str(path)), names, configs)
    ]
    assert not found, (
        "engine kinds tested outside serve_apps/engine_kinds (ask kind_of(config) and its capability flags, or add "
        "one to EngineKind):\n" + "\n".join(found)
    )


def test_every_spelling_of_a_kind_test_is_found() -> None:
    # Graded on a source whose kind tests are known, one a line; the last three lines test other things.
    source = "\n".join([
        "a = engine.kind == 'vllm'",
        "a = engine['kind'] != 'endpoint'",
        "a = engine.get('kind') == 'endpoint'",
        "a = 'simulated' == campaign.engine.kind",
        "a = config.kind in ('vllm', 'endpoint')",
        "a = engine_kind not in {'vllm'}",
        "a = isinstance(config, VllmEngineConfig)",
        "a = isinstance(config, (int, kinds.EndpointEngineConfig))",
        "a = type(config) is SimulatedEngineConfig",
        "match config.kind:\n    case 'vllm':\n        pass",
        "match config:\n    case EndpointEngineConfig(urls=u):\n        pass",
        "a = arm.policy.kind == 'off'",
        "a = topology.kind == 'single'",
        "a = isinstance(config, dict)",
    ])  # fmt: skip
    found = [line for line, _ in kind_tests(ast.parse(source), _kind_names(), _config_classes())]
    assert found == [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 14]


def test_the_graded_spellings_cover_every_registered_kind() -> None:
    # The guard reads the registry: each built-in kind's name and config class is something it refuses.
    for name, kind in kinds().items():
        line = f"a = x.kind == {name!r}\nb = isinstance(x, {kind.config.__name__})\n"
        assert [n for n, _ in kind_tests(ast.parse(line), _kind_names(), _config_classes())] == [1, 2], name
