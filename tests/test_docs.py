"""The docs match the code: generated pages are current, every command a reader is shown runs somewhere, links
resolve, and the README's first run and campaign do what the README says."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator import docgen

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SPECDRILL = [sys.executable, "-c", "from orchestrator.cli import main; main()"]

# Every command shown in a code block of the README or docs/, and where it runs: (file, text that runs it).
RUN_HERE: dict[str, tuple[str, str]] = {
    "make demo": ("Makefile", "\ndemo:"),
    "make test": ("Makefile", "\ntest:"),
    "make test-fast": ("Makefile", "\ntest-fast:"),
    "specdrill simulate campaigns/quickstart.yaml": ("tests/test_docs.py", "def test_the_first_run"),
    "specdrill simulate campaigns/replay-burstgpt-example.yaml": (
        "tests/test_replay_example.py", '"simulate", EXAMPLE',
    ),
    "ray job submit --address http://127.0.0.1:8265 --working-dir . -- specdrill run CAMPAIGN.yaml": (
        "tests/test_job_submit.py", '"job", "submit"',
    ),
    "specdrill report RUN_DIR": ("tests/test_campaign_run.py", '_cli("report"'),
    "specdrill recommend RUN_DIR": ("tests/test_campaign_run.py", '_cli("recommend"'),
    "infra/ray-up.sh": ("infra/demo.sh", "infra/ray-up.sh"),
    "infra/ray-down.sh": ("infra/demo.sh", "infra/ray-down.sh"),
    "specdrill deploy CAMPAIGN.yaml": ("tests/test_serve_sim.py", '_cli("deploy"'),
    "specdrill teardown CAMPAIGN.yaml": ("tests/test_serve_sim.py", '_cli("teardown"'),
    "specdrill simulate fixed-batch --policy fixed:3 --batch-sizes 1,8 --workload reasoning --json": (
        "tests/test_cli.py",
        '"fixed-batch",\n        "--policy",\n        "fixed:3",\n        "--batch-sizes",\n        "1,8",',
    ),
    "specdrill simulate sweep --workload chat --rates 10,60 --duration 30 --policies "
    "off,fixed:3,dynamic:3:1-64=3,65-128=1,129-512=0 --json": (
        "tests/test_cli.py", '"sweep", "--workload", "chat", "--rates", "10,60", "--duration", "30"',
    ),
}  # fmt: skip
# Commands that need a real (GPU) cluster: what they act on is checked by the named test.
NEEDS_A_CLUSTER: dict[str, tuple[str, str]] = {
    'kubectl create secret generic hf-token --from-literal=token="$HF_TOKEN"': (
        "tests/test_infra.py", "def test_the_hf_token_comes_only_from_an_optional_secret",
    ),
    "mkdir -m 700 ~/.specdrill-secrets": ("tests/test_infra.py", "def test_the_launchers_token_lines_validate"),
    'printf %s "$HF_TOKEN" > ~/.specdrill-secrets/hf-token': (
        "tests/test_infra.py", "def test_the_launchers_token_lines_validate",
    ),
    "ray up infra/cluster-launcher.yaml": (
        "tests/test_infra.py", "def test_cluster_launcher_config_follows_rays_schema",
    ),
    "specdrill models pull campaigns/gpu-llama3.1-8b-eagle.yaml": ("tests/test_infra.py", '"models", "pull"'),
    "kubectl port-forward svc/specdrill-head-svc 8265:8265": (
        "tests/test_infra.py", "def test_kuberay_manifests_follow_the_crd",
    ),
    "RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 -- specdrill models pull "
    "campaigns/gpu-llama3.1-8b-eagle.yaml": ("tests/test_infra.py", "def test_models_pull_runs_one_task_per_gpu_node"),
    "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=\"$(kubectl get secret specdrill -o jsonpath='{.data.auth_token}' "
    "| base64 -d)\"": ("tests/podbed.py", "def kuberay_secrets"),
    "ray job submit --address http://127.0.0.1:8265 -- specdrill run campaigns/gpu-llama3.1-8b-eagle.yaml": (
        "tests/test_manifests_start.py", "def test_the_rayclusters_pods_start_and_take_jobs_only_with_kuberays_token",
    ),
    "RAY_ADDRESS=... specdrill deploy --check campaigns/gpu-llama3.1-8b-eagle.yaml": (
        "tests/test_placement.py", '"deploy", "--check"',
    ),
    "RAY_ADDRESS=... specdrill deploy --check campaigns/gpu-llama3.1-8b-eagle.yaml --json": (
        "tests/test_placement.py", '"deploy", "--check"',
    ),
}  # fmt: skip


def _stale(page: str) -> None:
    if (REPO / page).read_text() != docgen.PAGES[page]():
        pytest.fail(f"{page} is stale: run make docs", pytrace=False)


def test_the_campaign_reference_is_current() -> None:
    _stale(docgen.CAMPAIGN_PAGE)


def test_the_trace_schema_page_is_current() -> None:
    _stale(docgen.TRACE_PAGE)


def test_every_note_names_a_real_field_or_column() -> None:
    from loadshapes.trace import COLUMNS

    declared = {
        f"{cls.__name__}.{name}"
        for model, _ in docgen.campaign_models()
        for cls in model.__mro__
        for name in inspect.get_annotations(cls)
    }
    assert sorted(set(docgen.FIELD_NOTES) - declared) == []
    assert sorted(set(docgen.TRACE_NOTES) - set(COLUMNS)) == []


def test_the_trace_schema_describes_the_timeline_files_and_the_prompt_hash() -> None:
    """Every column rundir.timeline_table writes has its meaning on the page (and no note names another), and
    prompt_sha256 is said to be a hash of the prompt, not the prompt."""
    columns = [name for name, _ in docgen.timeline_columns()]
    assert sorted(docgen.TIMELINE_NOTES) == sorted(columns)
    page = docgen.trace_schema()
    timelines = page.split("## Step timelines", 1)[1]
    assert "`timelines/arm=<arm>/shape=<shape>/r<repeat>.parquet`" in timelines
    for name, kind in docgen.timeline_columns():
        assert f"| `{name}` | `{kind}` | {docgen.TIMELINE_NOTES[name]} |" in timelines
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


def test_every_command_shown_runs_somewhere() -> None:
    known = {**RUN_HERE, **NEEDS_A_CLUSTER}
    unknown = {c: pages for c, pages in _shown_commands().items() if c not in known}
    assert unknown == {}, "add each to RUN_HERE with the test or make target that runs it, or remove it"
    for command, (path, needle) in known.items():
        assert needle in (REPO / path).read_text(), f"{command!r}: {path} no longer has {needle!r}"
    unused = sorted(set(known) - set(_shown_commands()))
    assert unused == [], "no page shows these any more: drop them"


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
    docs/simulator.md's `python -m orchestrator.agreement` on that run against itself agrees."""
    run, result = first_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "vLLM's data-parallel fallback" in result.stdout and "all gates pass" in result.stdout
    assert (run / "report.html").is_file()
    summary = run / "summary.json"
    agreement = subprocess.run(
        [sys.executable, "-m", "orchestrator.agreement", str(summary), str(summary)],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert agreement.returncode == 0, agreement.stdout + agreement.stderr
    assert json.loads(summary.read_text())["verification"]["arms"]


FirstRun = tuple[Path, subprocess.CompletedProcess[str]]


def test_running_md_shows_the_quickstarts_answer_block(first_run: FirstRun) -> None:
    """docs/running.md's answer block is the one this run printed first, line for line (make docs writes it)."""
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
    assert html.index("<h2>Answer</h2>") < html.index("<svg")
    assert '<span class="unverified">not exercised</span>' in html and "dyn-dp2: dyn-dp2:" not in html
    assert '<span class="badge pass">gates pass (dyn-dp2 failed, exempt)</span>' in html


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
