"""The docs by reader. docs/ holds three shelves, each page on one, and docs/README.md names every page: the
operator's (docs/operator/: tasks, each from a command and its output), the reference (docs/reference/, generated)
and the engineering notes (docs/engineering/). The operator's pages, the reference pages and the README carry no
implementer's references: no file:line (nor a vLLM version's line numbers), no source path, no test path, no issue
number, no test name (their place is the engineering shelf)."""

from __future__ import annotations

import re
from pathlib import Path

from tests import REPO

DOCS = REPO / "docs"
SHELVES = ("operator", "reference", "engineering")
OPERATOR_PAGES = [REPO / "README.md", *sorted((DOCS / "operator").glob("*.md"))]
# The generated reference reads the code's field descriptions: what they say reaches the reader as written.
READER_PAGES = [*OPERATOR_PAGES, *sorted((DOCS / "reference").glob("*.md"))]

# What an operator page must not carry: where the code says something (file:line), why it changed (an issue or a
# pull request by number) and what checks it (a test's name). Each belongs in the engineering notes.
IMPLEMENTER = {
    "a file:line reference": re.compile(r"\b\w+\.py:\d+"),
    # vLLM's code cited by version: `scheduler.py` 0.33:502-544 (not an address: 127.0.0.1:8265)
    "a version's line numbers": re.compile(r"(?<![\w.])\d+\.\d+:\d+"),
    "a source path": re.compile(r"[\w./-]*\w\.py\b"),
    "a test path": re.compile(r"(?<![\w/.-])tests/"),
    "an issue number": re.compile(r"\bissues? \d+|#\d+", re.IGNORECASE),
    "a test name": re.compile(r"\btest_\w+"),
}
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)  # markers for the docs tooling, not shown to the reader


def implementer_references(text: str) -> list[str]:
    """Each implementer's reference in the text a reader sees, with its line: empty for an operator's page."""
    visible = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [
        f"line {number}: {what} {match.group(0)!r}"
        for number, line in enumerate(visible.splitlines(), 1)
        for what, pattern in IMPLEMENTER.items()
        for match in pattern.finditer(line)
    ]


def test_the_rule_finds_each_kind_of_reference_and_nothing_an_operator_reads() -> None:
    assert implementer_references("see orchestrator/runner.py:118 and `core.py:753-759`") == [
        "line 1: a file:line reference 'runner.py:118'",
        "line 1: a file:line reference 'core.py:753'",
        "line 1: a source path 'orchestrator/runner.py'",
        "line 1: a source path 'core.py'",
    ]
    assert [r.split(": ", 1)[1] for r in implementer_references("Issue 40 fixed it\n(vllm#49548)")] == [
        "an issue number 'Issue 40'",
        "an issue number '#49548'",
    ]
    assert implementer_references("tests/test_x.py::test_the_first_run") == [
        "line 1: a source path 'tests/test_x.py'",
        "line 1: a test path 'tests/'",
        "line 1: a test name 'test_x'",
        "line 1: a test name 'test_the_first_run'",
    ]
    assert implementer_references("<!-- generated; tests/test_docs.py\nfails when stale -->\nok") == []
    cited = "(`_drafts_unused`, `v1/core/sched/scheduler.py` 0.33:502-544, set at 734; 0.34:519-561)"
    assert [r.split(": ", 1)[1] for r in implementer_references(cited)] == [
        "a version's line numbers '0.33:502'",
        "a version's line numbers '0.34:519'",
        "a source path 'v1/core/sched/scheduler.py'",
    ]
    assert [r.split(": ", 1)[1] for r in implementer_references("run `python bench_x.py`; see tests/data/kuberay")] == [
        "a source path 'bench_x.py'",
        "a test path 'tests/'",
    ]
    shown = "batch 9-64: k=3 (k3-single), 1.644x [1.635, 1.653] n=1319; [1-8](which-k.md#read-it), `-o fitted.yaml`"
    assert implementer_references(shown) == []
    commands = "ray job submit --address http://127.0.0.1:8265; python -m examples.make_burstgpt_sample; 12:30 UTC"
    assert implementer_references(commands + "; vLLM 0.33 and 0.34; 0.5 s; .pyc; runs/dp2-chat/tests") == []


def test_the_operator_and_reference_pages_carry_no_implementers_reference() -> None:
    assert len(OPERATOR_PAGES) > 5, "the operator's shelf is missing"
    assert len(READER_PAGES) >= len(OPERATOR_PAGES) + 3, "the reference shelf is missing"
    found = {str(p.relative_to(REPO)): implementer_references(p.read_text()) for p in READER_PAGES}
    assert {page: refs for page, refs in found.items() if refs} == {}, "move these to docs/engineering/"


def _links(page: Path) -> set[Path]:
    return {
        (page.parent / target.split("#", 1)[0]).resolve()
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text())
        if not re.match(r"[a-z]+:", target) and not target.startswith("#")
    }


def test_every_page_is_on_a_shelf_and_the_index_names_it() -> None:
    pages = sorted(DOCS.rglob("*.md"))
    loose = [str(p.relative_to(DOCS)) for p in pages if p.parent != DOCS and p.parent.name not in SHELVES]
    loose += [p.name for p in pages if p.parent == DOCS and p.name != "README.md"]
    assert loose == [], "put each page on a shelf: " + ", ".join(SHELVES)
    index = DOCS / "README.md"
    unnamed = [str(p.relative_to(DOCS)) for p in pages if p != index and p.resolve() not in _links(index)]
    assert unnamed == [], "docs/README.md names every page"
    assert (DOCS / "README.md").resolve() in _links(REPO / "README.md"), "the README points to the index"
