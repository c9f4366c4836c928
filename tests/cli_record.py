"""Which `specdrill` command forms this test session ran: every invocation (in the test process through click's
`Command.main`, in a child through tests/cli_shim/sitecustomize.py) is appended to the file named by
SPECDRILL_CLI_LOG with the test that ran it, and a documented command line is compared with them as a form: the
command words, the options it shows (by parameter, whatever their values) and its arguments (a path such as
`campaigns/quickstart.yaml` must be that file; a placeholder such as RUN_DIR matches any)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import click

LOG_ENV = "SPECDRILL_CLI_LOG"
SHIM = Path(__file__).resolve().parent / "cli_shim"
_PLACEHOLDER = re.compile(r"[A-Z]{2,}")  # RUN_DIR, CAMPAIGN.yaml, RUN_DIR/recommended-campaign.yaml, A


@dataclass(frozen=True)
class Form:
    path: tuple[str, ...]
    options: frozenset[str]
    arguments: tuple[str, ...] | None  # None: any (the line shows none: `specdrill simulate oracle`)
    # A command named without the arguments it needs and without options (`specdrill report`): nothing to run.
    is_mention: bool = False

    def covered_by(self, ran: Form) -> bool:
        if ran.path != self.path or not self.options <= ran.options:
            return False
        if self.arguments is None:
            return True
        return (
            ran.arguments is not None
            and len(ran.arguments) == len(self.arguments)
            and all(_same_argument(doc, got) for doc, got in zip(self.arguments, ran.arguments, strict=True))
        )


def _same_argument(documented: str, ran: str) -> bool:
    """A placeholder (RUN_DIR) or a bare example name (first.yaml, c.yaml: a file the reader writes) matches any
    argument, but a literal last part after a placeholder must be there (RUN_DIR/recommended-campaign.yaml); a
    path with a directory (campaigns/quickstart.yaml) is that file, relative or under another directory."""
    head, _, last = documented.rpartition("/")
    if _PLACEHOLDER.search(last) or not head:
        return True
    if _PLACEHOLDER.search(head):
        return ran == last or ran.endswith("/" + last)
    return ran == documented or ran.endswith("/" + documented)


def resolve(words: list[str]) -> tuple[list[str], click.Command, list[str]] | None:
    """The command words an operator types before --help, the command that runs and the words it parses, or
    None where the CLI names no such command."""
    from orchestrator.cli import cli

    path: list[str] = []
    command: click.Command = cli
    rest = list(words)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        if rest[0] in command.commands:
            path.append(rest[0])
            command, rest = command.commands[rest[0]], rest[1:]
            continue
        try:  # `simulate CAMPAIGN` names no subcommand: the group resolves it to its campaign command
            _, found, rest = command.resolve_command(click.Context(command), rest)
        except click.UsageError:
            return None
        if found is None:
            return None
        command = found
    return path, command, rest


def form_of(words: list[str]) -> Form | None:
    """The form of `specdrill WORDS` (words after `specdrill`), or None where the CLI names no such command."""
    resolved = resolve(words)
    if resolved is None:
        return None
    path, command, rest = resolved
    by_flag = {flag: param for param in command.params if isinstance(param, click.Option) for flag in param.opts}
    options: set[str] = set()
    arguments: list[str] = []
    words_left = iter(rest)
    for word in words_left:
        if word.startswith("-") and word != "-":
            flag, has_value, _ = word.partition("=")
            param = by_flag.get(flag)
            options.add(param.name if param is not None and param.name else flag.lstrip("-"))
            if param is not None and not param.is_flag and not has_value:
                next(words_left, None)
        else:
            arguments.append(word)
    needed = sum(1 for p in command.params if isinstance(p, click.Argument) and p.required)
    complete = not isinstance(command, click.Group) and len(arguments) >= needed
    mention = not options and not complete
    return Form(tuple(path), frozenset(options), tuple(arguments) if complete and arguments else None, mention)


@dataclass(frozen=True)
class Invocation:
    test: str  # the node id of the test (or fixture) that ran it
    args: tuple[str, ...]

    @property
    def module(self) -> str:
        return self.test.split("::", 1)[0]


def record(args: list[str]) -> None:
    """Appends an invocation made in this process (the CLI group's main)."""
    log = os.environ.get(LOG_ENV)
    if not log:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "")
    with open(log, "a", encoding="utf-8") as out:
        out.write(json.dumps({"test": test, "args": list(args), "cwd": os.getcwd()}) + "\n")


def invocations(log: Path) -> list[Invocation]:
    found: list[Invocation] = []
    if not log.exists():
        return found
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a child killed mid-write (the interrupt tests)
        test = str(entry.get("test", "")).rsplit(" (", 1)[0]  # PYTEST_CURRENT_TEST ends with " (call)"
        found.append(Invocation(test, tuple(str(a) for a in entry.get("args", []))))
    return found
