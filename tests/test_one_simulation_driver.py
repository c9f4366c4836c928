"""One simulation driver and one definition of what users feel, found by reading the code (ast):

- simulated engine cores are stepped in one place per clock: virtual time in serve_apps/sim/virtual.py (the open
  and the closed loop that campaigns, tune's played traffic, fixed-batch experiments, the oracle and ground truth
  all use), real time in serve_apps/sim/realtime.py (the served engine);
- a unit's traffic is played into an arm's engines, and its trace rows made, by the virtual executor alone
  (orchestrator/virtual/executor.py: play_unit, for the unit loop and for tune's in-memory play);
- what users feel (goodput against the SLO, quantiles of TTFT, TPOT, end-to-end, queue wait) is computed in memory
  by loadshapes/experience.py alone (the analysis computes it in SQL, tested equal to it), and the SLO's rule is
  applied request by request only by loadshapes itself (the rule, its array form, the live counter).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("orchestrator", "serve_apps", "loadshapes")
CODE = (*PRODUCT, "benchmarks", "tools")

STEPPERS = {"serve_apps/sim/virtual.py", "serve_apps/sim/realtime.py", "serve_apps/sim/engine.py"}
UNIT_PLAY = {"orchestrator/virtual/executor.py"}
# The unit play's parts (orchestrator.virtual.traffic, orchestrator.virtual.rows) and the driver's loops: who may
# import them. The traffic forms fed to the driver: a campaign's (traffic.py) and a workload's (experiments.py).
GUARDED_IMPORTS = {
    ("orchestrator.virtual.traffic", "play"): UNIT_PLAY,
    ("orchestrator.virtual.traffic", "simulate_open_loop"): UNIT_PLAY,
    ("orchestrator.virtual.traffic", "simulate_closed_loop"): UNIT_PLAY,
    ("orchestrator.virtual.rows", "trace_table"): UNIT_PLAY,
    ("serve_apps.sim.virtual", "run_open_loop"): {
        "orchestrator/virtual/traffic.py", "orchestrator/virtual/experiments.py", "benchmarks/bench_simulator.py",
    },
    ("serve_apps.sim.virtual", "run_closed_loop"): {
        "orchestrator/virtual/traffic.py", "orchestrator/virtual/experiments.py",
    },
}  # fmt: skip

EXPERIENCE = "loadshapes/experience.py"
SLO_RULE = {"loadshapes/slo.py", EXPERIENCE, "loadshapes/plan.py"}  # the rule, its array form, the live counter
QUANTILES = {"quantile", "percentile", "median", "nanquantile", "nanpercentile", "nanmedian"}
USER_LATENCY = re.compile(r"tpot|ttft|e2e|queue_wait|latenc", re.IGNORECASE)
# Statistics over seeds, not over requests: each seed's figure came from loadshapes.experience.
OVER_SEEDS = {
    ("orchestrator/decide/scoring.py", "paired_excess"): "the median over seeds of per-seed latency ratios",
    ("orchestrator/decide/tune/simplify.py", "no_predicted_gain"): "the median over seeds of per-seed ratios",
    ("orchestrator/decide/tune/static.py", "smallest_within"): "per band, the median over seeds of per-seed ratios",
    ("orchestrator/decide/tune/categories.py", "category_lines"): "per category, the median over seeds of per-seed "
    "ratios",
}


def _modules(folders: tuple[str, ...]) -> Iterator[tuple[str, ast.Module]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), filename=str(path))


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def test_engine_cores_are_stepped_by_the_one_driver_of_each_clock() -> None:
    found = [
        f"{name}:{node.lineno}: steps an engine core (run_steps)"
        for name, tree in _modules(CODE)
        if name not in STEPPERS
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run_steps"
    ]
    assert not found, "a second simulation driver:\n" + "\n".join(found)


def test_the_unit_play_and_the_drivers_loops_are_used_where_they_belong() -> None:
    found = [
        f"{name}:{node.lineno}: imports {node.module}.{alias.name}"
        for name, tree in _modules(CODE)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if (node.module, alias.name) in GUARDED_IMPORTS and name not in GUARDED_IMPORTS[(node.module or "", alias.name)]
    ]
    assert not found, "a second unit play or traffic driver:\n" + "\n".join(found)


def _applies_the_slo(call: ast.Call) -> bool:
    # SloConfig.met / Deadlines.met (experience.met, the array form, is called by name)
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr == "met" and any(k.arg == "ok" for k in call.keywords)


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _mentions_user_latency(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    docstring = ast.get_docstring(function, clean=False)
    for node in ast.walk(function):
        if isinstance(node, ast.Constant) and node.value == docstring:
            continue
        text = (
            node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
            else node.arg if isinstance(node, ast.arg)
            else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        )  # fmt: skip
        if text is not None and USER_LATENCY.search(text):
            return True
    return False


def test_what_users_feel_is_computed_by_one_module() -> None:
    """A quantile taken in a function about users' latencies, or the SLO's rule applied per request, outside
    loadshapes/experience.py (and the rule's own home) is a second definition of what users feel."""
    found = []
    for name, tree in _modules(PRODUCT):
        if name == EXPERIENCE:
            continue
        for function in _functions(tree):
            if (name, function.name) in OVER_SEEDS:
                continue
            calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
            quantiles = [c for c in calls if _called(c) in QUANTILES and isinstance(c.func, ast.Attribute)]
            if quantiles and _mentions_user_latency(function):
                found += [f"{name}:{c.lineno}: {function.name} takes a quantile of users' latencies" for c in quantiles]
            if name not in SLO_RULE:
                found += [
                    f"{name}:{c.lineno}: {function.name} applies the SLO's rule (met) request by request"
                    for c in calls
                    if isinstance(c.func, ast.Attribute)
                    and c.func.attr == "met"
                    and any(k.arg == "ok" for k in c.keywords)
                ]
    assert not found, "a second definition of what users feel:\n" + "\n".join(found)
