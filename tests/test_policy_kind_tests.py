"""A speculation policy of another engine's design (SGLang's, TensorRT-LLM's) is told apart only where its facts
live (serve_apps/policy_kinds.py: `facts(kind)`, `vllm_policy`, `engine_config`) and in the policy modules
themselves: a place that tests `policy.kind == "sglang_adaptive"` or `isinstance(p, TrtllmSchedulePolicy)` is a
place the next design silently falls through. The same syntax-tree reading as the engine kinds' guard
(tests/test_kind_tests.py), with the policy kinds' names and classes."""

from __future__ import annotations

import ast

from serve_apps.policies import OtherEnginePolicy
from serve_apps.policy_kinds import POLICY_KINDS, facts
from tests import REPO as ROOT
from tests.test_kind_tests import SCANNED, kind_tests

# Where the designs are defined, parsed, resolved and run
ALLOWED = tuple(
    ROOT / p
    for p in ("serve_apps/policies.py", "serve_apps/policies_sglang.py", "serve_apps/policies_trtllm.py",
              "serve_apps/policy_kinds.py", "serve_apps/resolved.py", "serve_apps/sim/rules")
)  # fmt: skip


def _names() -> frozenset[str]:
    return frozenset(name for name in POLICY_KINDS if not facts(name).runs_on_vllm)


def _classes() -> frozenset[str]:
    return frozenset(cls.__name__ for cls in OtherEnginePolicy.__args__)


def test_other_engines_policy_kinds_are_told_apart_only_where_their_facts_live() -> None:
    names, classes = _names(), _classes()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for package in SCANNED
        for path in sorted((ROOT / package).rglob("*.py"))
        if not any(path == a or a in path.parents for a in ALLOWED)
        for line, code in kind_tests(ast.parse(path.read_text(), filename=str(path)), names, classes)
    ]
    assert not found, (
        "another engine's policy kind tested by name or class (ask serve_apps.policy_kinds.facts(kind), or add a "
        "fact to PolicyKind):\n" + "\n".join(found)
    )


def test_the_guard_reads_every_other_engines_kind() -> None:
    assert _names() == {"sglang_adaptive", "trtllm_schedule", "trtllm_max_concurrency", "trtllm_acceptance_gate"}
    source = "\n".join([
        "a = arm.policy.kind == 'sglang_adaptive'",
        "a = policy.kind in ('trtllm_schedule', 'trtllm_max_concurrency')",
        "a = isinstance(policy, TrtllmAcceptanceGatePolicy)",
        "match policy:\n    case SglangAdaptivePolicy(num_steps=n):\n        pass",
        "a = arm.policy.kind == 'dynamic'",
    ])  # fmt: skip
    found = [line for line, _ in kind_tests(ast.parse(source), _names(), _classes())]
    assert found == [1, 2, 3, 5]
