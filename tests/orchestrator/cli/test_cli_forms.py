"""Every `specdrill ...` command line the README and the docs show is one the CLI accepts, and the `--help` an
operator would ask for (the words typed before the first argument, then --help) shows that form: its options and
its arguments (issue 25: `simulate --help` did not show the README's `simulate CAMPAIGN`). Parsed, not run."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from tests import REPO as ROOT
from tests.cli_record import resolve

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _alternatives(text: str) -> list[str]:
    """Metasyntax written out: `run|simulate CAMPAIGN`, `fixed-batch | sweep | oracle`, `a && b`; `...` and
    `[OPTIONAL...]` dropped."""
    out: list[str] = []
    for part in text.split("&&"):
        part = re.sub(r"\[[^\]]*\]|\.\.\.", " ", part).strip()
        pieces = [p.strip() for p in part.split(" | ")]
        head = pieces[0].split()
        forms = [head] + [[*head[:-1], *p.split()] for p in pieces[1:]]
        for words in forms:
            choices = [w.split("|") if "|" in w and not w.startswith("-") else [w] for w in words]
            expanded: list[list[str]] = [[]]
            for options in choices:
                expanded = [[*e, o] for e in expanded for o in options]
            out += [" ".join(e) for e in expanded]
    return out


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line): fenced code lines that run specdrill (also after `ray job submit ... --`), and
    inline `specdrill ...` code."""
    found: list[tuple[str, str]] = []
    for path in DOCS:
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        fenced = False
        for line in text.splitlines():
            if line.strip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                line = line.strip()
                command = line.split(" -- ", 1)[1] if " -- specdrill " in line else line
                if command.startswith("specdrill ") and not command.startswith("specdrill:"):
                    found += [(where, c) for c in _alternatives(command)]
        for inline in re.findall(r"`(specdrill [^`]+)`", text):
            found += [(where, c) for c in _alternatives(inline)]
    return sorted(set(found))


def test_the_docs_show_commands() -> None:
    commands = {c for _, c in documented_commands()}
    # the forms the README opens with, found (the scan is not silently empty)
    assert {"specdrill simulate campaigns/quickstart.yaml", "specdrill report RUN_DIR"} <= commands
    assert "specdrill run CAMPAIGN.yaml" in commands and "specdrill simulate sweep" in commands


@pytest.mark.parametrize(("where", "line"), documented_commands())
def test_every_documented_command_is_accepted_and_in_its_help(where: str, line: str) -> None:
    words = line.split()[1:]
    try:
        resolved = resolve(words)
        assert resolved is not None, words
        path, command, rest = resolved
    except click.UsageError as exc:
        pytest.fail(f"{where}: `{line}` names no command of the CLI: {exc.format_message()}")
    # A line with arguments is an invocation, parsed strictly (no unknown option, no missing or extra argument);
    # one without is a mention of the command and its options (`specdrill deploy --check`).
    complete = any(not w.startswith("-") for w in rest) and not isinstance(command, click.Group)
    try:
        ctx = command.make_context(" ".join(["specdrill", *path]), list(rest), resilient_parsing=not complete)
    except click.UsageError as exc:
        pytest.fail(f"{where}: `{line}` is refused by the CLI: {exc.format_message()}")
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="specdrill")
    assert result.exit_code == 0, result.output
    shown = result.output
    for option in (w.split("=", 1)[0] for w in words if w.startswith("--")):
        assert option in shown, f"{where}: `{line}`: `specdrill {' '.join(path)} --help` does not show {option}"
    if complete:
        usage = f"specdrill {' '.join(path)} {' '.join(command.collect_usage_pieces(ctx))}"
        assert usage in shown, f"{where}: `{line}`: `specdrill {' '.join(path)} --help` does not show `{usage}`"


def test_simulate_help_shows_the_campaign_form() -> None:
    shown = CliRunner().invoke(cli, ["simulate", "--help"], prog_name="specdrill").output
    assert shown.startswith(
        "Usage: specdrill simulate [OPTIONS] CAMPAIGN_FILE\n   or: specdrill simulate [OPTIONS] COMMAND [ARGS]...\n"
    )
    assert "Options of specdrill simulate CAMPAIGN_FILE:\n  --output TEXT" in shown and "--no-report" in shown
