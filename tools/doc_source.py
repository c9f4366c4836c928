"""Descriptions from the source itself, for the generated reference pages (tools/docgen.py): the comment
block right above a field or column and the comment at the end of its line, read with ast + tokenize so they stay
where the code's readers see them."""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from pydantic import BaseModel

# Tool directives, not prose.
DIRECTIVES = ("fmt:", "noqa", "type:", "pragma:")


@dataclass(frozen=True)
class Source:
    lines: list[str]  # the code, 1-based through lines[n - 1]
    comments: dict[int, str]  # line -> comment text without '#'
    tree: ast.Module

    def above(self, line: int) -> list[str]:
        """The comment lines right above `line` (a block with no code or blank line in between)."""
        out: list[str] = []
        at = line - 1
        while at >= 1 and self.lines[at - 1].lstrip().startswith("#"):
            out.insert(0, self.comments.get(at, ""))
            at -= 1
        return [c for c in out if c]

    def trailing(self, first: int, last: int) -> list[str]:
        return [
            self.comments[n]
            for n in range(first, last + 1)
            if n in self.comments and not self.lines[n - 1].lstrip().startswith("#")
        ]


def source(text: str) -> Source:
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comment = token.string.lstrip("#").strip()
            if not comment.startswith(DIRECTIVES):
                comments[token.start[0]] = comment
    return Source(lines=text.splitlines(), comments=comments, tree=ast.parse(text))


@cache
def _classsource(cls: type) -> Source:
    return source(textwrap.dedent(inspect.getsource(cls)))


def sentence(parts: Sequence[str]) -> str:
    return " ".join(" ".join(parts).split())


def field_comment(model: type[BaseModel], name: str) -> str:
    """The comments of the class in the MRO that declares `name`."""
    for cls in model.__mro__:
        if name not in inspect.get_annotations(cls):
            continue
        src = _classsource(cls)
        body = src.tree.body[0]
        assert isinstance(body, ast.ClassDef)
        for node in body.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                end = node.end_lineno or node.lineno
                return sentence(src.above(node.lineno) + src.trailing(node.lineno, end))
        return ""
    return ""


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
