"""The operator's pages answer with real output: their worked example (docs/operator/worth-it.md's campaign, a
Llama-3.1-8B + EAGLE fleet on data parallelism 2 serving chat at ~12 req/s) runs as the pages show it, and every
output block under an `<!-- output of `COMMAND` -->` marker is, line for line, what that command printed (run ids
aside: they carry the time of the run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import REPO

OPERATOR = REPO / "docs" / "operator"
SPECDRILL = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
_RUN_ID = re.compile(r"\b([\w-]+)-\d{8}T\d{6}-[0-9a-f]{6}\b")
_MARKED = re.compile(r"<!-- output of `([^`]+)` -->\s*```text\n(.*?)^```", re.DOTALL | re.MULTILINE)


def shown_outputs() -> dict[str, list[tuple[str, list[str]]]]:
    """Command -> (page, the lines shown as its output) for every marked block of the operator's pages."""
    shown: dict[str, list[tuple[str, list[str]]]] = {}
    for page in sorted(OPERATOR.glob("*.md")):
        for command, body in _MARKED.findall(page.read_text()):
            shown.setdefault(command, []).append((page.name, body.splitlines()))
    return shown


def _same(line: str) -> str:
    return _RUN_ID.sub(r"\1-RUN", line.rstrip())


def not_printed(shown: list[str], printed: str) -> list[str]:
    """The shown lines (but `...`, an elision) that the command did not print."""
    lines = {_same(line) for line in printed.splitlines()}
    return [line for line in shown if line.strip() != "..." and _same(line) not in lines]


THREE_DESIGNS = "specdrill simulate campaigns/three-designs.yaml"
QUICKSTART = "specdrill simulate campaigns/quickstart.yaml"


def _specdrill(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECDRILL, *args], capture_output=True, text=True, timeout=600, check=False, cwd=cwd)


def _campaign() -> str:
    text = (OPERATOR / "worth-it.md").read_text()
    return next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "name: dp2-chat" in b)


def test_a_shown_line_the_command_did_not_print_is_found() -> None:
    printed = "run dp2-chat-20261206T025840-7a77f1 (virtual time)\n  k=3 1.644x  \n"
    assert not_printed(["run dp2-chat-20261206T030112-1e98ab (virtual time)", "  k=3 1.644x", "..."], printed) == []
    assert not_printed(["  k=3 1.645x"], printed) == ["  k=3 1.645x"]


@pytest.mark.slow  # ~30 s: two simulated campaigns, recommend, a short tune, compare
@pytest.mark.timeout(900)
def test_the_operator_pages_worked_example_runs_as_shown(tmp_path: Path) -> None:
    """worth-it.md's campaign simulated, recommend for data_parallel:2, tune for it (a small budget: the page's
    two minutes give the same static k), and release-check.md's n-gram candidate compared: each exit code as the
    pages say, each marked block printed as shown."""
    shown = shown_outputs()
    campaign = _campaign()
    assert yaml.safe_load(campaign)["engine"]["profile"] == "llama3.1-8b-h100-eagle"
    (tmp_path / "dp2-chat.yaml").write_text(campaign)
    candidate = campaign.replace("profile: llama3.1-8b-h100-eagle}", "profile: llama3.1-8b-h100-ngram}", 1)
    assert candidate != campaign
    (tmp_path / "dp2-chat-ngram.yaml").write_text(candidate)
    runs = [
        ("specdrill simulate dp2-chat.yaml --output runs/dp2-chat", 0),
        ("specdrill recommend runs/dp2-chat --topology data_parallel:2", 0),
        ("specdrill simulate dp2-chat-ngram.yaml --output runs/dp2-chat-ngram", 0),
        ("specdrill compare runs/dp2-chat runs/dp2-chat-ngram --fail-on worse --fail-on policy-change"
         " -o release-check", 3),
    ]  # fmt: skip
    elsewhere = {THREE_DESIGNS, QUICKSTART}  # run by their own tests below
    assert {command for command, _ in runs} | elsewhere >= set(shown), "a marked block of a command no test runs"
    for command, code in runs:
        result = _specdrill(tmp_path, *command.split()[1:])
        assert result.returncode == code, f"{command}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
        for page, lines in shown.get(command, []):
            assert not_printed(lines, result.stdout) == [], f"{page}: `{command}` printed otherwise"
    tune = _specdrill(tmp_path, "tune", "dp2-chat.yaml", "--topology", "data_parallel:2", "--budget", "2",
                      "--seeds", "1", "-o", "runs/tune")  # fmt: skip
    assert tune.returncode == 0, tune.stderr[-2000:]
    page = (OPERATOR / "which-k.md").read_text()
    answer = page.split("answer for data_parallel:2 (dp2)", 1)[1].splitlines()[:2]
    assert not_printed(["answer for data_parallel:2 (dp2)" + answer[0], answer[1]], tune.stdout) == []


@pytest.mark.slow  # ~15 s: the shipped three-designs campaign, 18 units
@pytest.mark.timeout(600)
def test_the_three_designs_page_runs_as_shown(tmp_path: Path) -> None:
    """three-designs.md's command on the shipped campaign (a copy, so its run directory lands in tmp_path): every
    marked block printed as shown, exit 0 (every arm ran its own rule)."""
    shown = shown_outputs().get(THREE_DESIGNS, [])
    assert shown, "three-designs.md shows no output of its command"
    (tmp_path / "campaigns").mkdir()
    (tmp_path / "campaigns" / "three-designs.yaml").write_text((REPO / "campaigns" / "three-designs.yaml").read_text())
    result = _specdrill(tmp_path, *THREE_DESIGNS.split()[1:])
    assert result.returncode == 0, f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
    for page, lines in shown:
        assert not_printed(lines, result.stdout) == [], f"{page}: `{THREE_DESIGNS}` printed otherwise"


@pytest.mark.timeout(300)
def test_the_first_run_page_runs_as_shown(tmp_path: Path) -> None:
    """first-run.md's command on the shipped quickstart (a copy, run in tmp_path as from the repository root):
    every marked block printed as shown (the units, the time scale line, the acceptance by category, the
    executed policy, the gates), exit 0 (its one failing arm is exempt)."""
    shown = shown_outputs().get(QUICKSTART, [])
    assert {page for page, _ in shown} == {"first-run.md"} and len(shown) >= 4, shown
    (tmp_path / "campaigns").mkdir()
    (tmp_path / "campaigns" / "quickstart.yaml").write_text((REPO / "campaigns" / "quickstart.yaml").read_text())
    result = _specdrill(tmp_path, *QUICKSTART.split()[1:])
    assert result.returncode == 0, f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
    for page, lines in shown:
        assert not_printed(lines, result.stdout) == [], f"{page}: `{QUICKSTART}` printed otherwise"
