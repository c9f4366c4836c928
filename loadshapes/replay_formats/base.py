"""The interface every replay format implements, and the figures a reader returns.

A format declares its name, the keys a category rule can look at, how it is recognised from the path and the
file's first bytes (`detects`, asked in the registry's order), and how it reads a window's arrivals and, where the
trace records them, the lengths of chosen rows. Formats of arrival times only (csv, specdrill) are one file read
whole (OneFileFormat); formats with lengths stream (streaming.StreamedFormat).
"""

from __future__ import annotations

import csv
import functools
import io
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow.fs as pafs

from loadshapes.trace import filesystem

Format = Literal["azure", "burstgpt", "mooncake", "specdrill", "csv"]

NS = 1_000_000_000


class TraceError(ValueError):
    """A trace that cannot be replayed; the message is one line naming the file (and line and field)."""


@dataclass(frozen=True)
class Arrivals:
    """The window's arrivals in time order: nanoseconds from the trace's first arrival, and file row numbers."""

    ns: np.ndarray  # int64
    rows: np.ndarray  # int64: 0-based data rows (header and blank lines not counted); what read_contents takes
    failed: np.ndarray  # bool: recorded as failed (BurstGPT's 0 response tokens); all False elsewhere
    files: np.ndarray  # int64: which of the paths each arrival is from
    has_lengths: bool
    # The window's recorded lengths (traces with lengths), for sizing the plan before it is built.
    max_prompt_tokens: int = 0
    max_output_tokens: int = 0
    mean_prompt_tokens: float = 0.0
    mean_output_tokens: float = 0.0


@dataclass(frozen=True)
class Contents:
    """Recorded lengths of the rows asked for, in the order asked."""

    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    labels: dict[str, np.ndarray]  # rule key -> value per row (object arrays of str)
    hash_ids: list[np.ndarray] | None  # Mooncake's prefix blocks per row


class Probe:
    """What detection looks at, each read only when a format asks: the path, and the file's first 64 KiB."""

    def __init__(self, path: str, fs: Any, base: str, directory: bool) -> None:
        self.path = path
        self.directory = directory
        self._fs = fs
        self._base = base

    @property
    def suffix(self) -> str:
        return posixpath.splitext(self.path.rstrip("/"))[1].lower()

    @functools.cached_property
    def head(self) -> bytes:
        with self._fs.open_input_stream(self._base) as stream:
            head: bytes = stream.read(64 << 10)
        return head

    @functools.cached_property
    def text(self) -> str:
        return self.head.decode("utf-8-sig", errors="replace").lstrip()

    @functools.cached_property
    def header(self) -> set[str]:
        """The first line's CSV cells, stripped."""
        try:
            first = next(csv.reader(io.StringIO(self.text.split("\n", 1)[0])), [])
        except csv.Error as exc:  # a lone carriage return, a NUL: random bytes, not a trace of any format
            raise TraceError(
                f"{self.path}: not a replay file (CSV, JSONL or Parquet): its first line is not CSV ({exc})"
            ) from None
        return {c.strip() for c in first}


def probe(path: str) -> Probe:
    fs, base = filesystem(path)
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.NotFound:
        raise TraceError(f"{path}: no such file or directory")
    return Probe(path, fs, base, info.type == pafs.FileType.Directory)


class ReplayFormat(ABC):
    name: ClassVar[Format]
    # What a category rule can look at (`file` is the file's name, for Azure's code and conversation files).
    rule_keys: ClassVar[tuple[str, ...]] = ()
    # Whether the trace records each request's lengths (else the mix draws them).
    has_lengths: ClassVar[bool] = False

    @abstractmethod
    def detects(self, probe: Probe) -> bool:
        """Whether the file is of this format (asked after the formats before it in the registry said no)."""

    @abstractmethod
    def read_arrivals(
        self, paths: Sequence[str], *, start_s: float, duration_s: float | None, keep_failed: bool,
        column: str | None, arm: str | None, shape: str | None,
    ) -> Arrivals:  # fmt: skip
        """The arrivals inside [start_s, start_s + duration_s) of the trace's own seconds from its first arrival."""

    def read_contents(self, paths: Sequence[str], files: np.ndarray, rows: np.ndarray) -> Contents:
        """The recorded lengths (and rule keys, prefix blocks) of rows `rows` of files `files` (indices into paths)."""
        raise TraceError(f"{paths[0]}: a {self.name} trace records arrival times only, no lengths")


class OneFileFormat(ReplayFormat):
    """Arrival times only, from one file or trace directory read whole."""

    @abstractmethod
    def arrival_ns(self, path: str, column: str | None, arm: str | None, shape: str | None) -> np.ndarray:
        """Every arrival's time in ns (any origin, any order); refuses options that do not apply first."""

    def read_arrivals(
        self, paths: Sequence[str], *, start_s: float, duration_s: float | None, keep_failed: bool,
        column: str | None, arm: str | None, shape: str | None,
    ) -> Arrivals:  # fmt: skip
        path = paths[0]
        if len(paths) != 1:
            raise TraceError(f"{', '.join(paths)}: a {self.name} trace is one file or trace directory")
        ns = self.arrival_ns(path, column, arm, shape)
        order = np.argsort(ns, kind="stable")
        ns = ns[order] - ns[order[0]]
        inside = in_window(ns, start_s, duration_s)
        if not inside.any():
            raise TraceError(f"{path}: no arrivals in the window {window(start_s, duration_s)}")
        n = int(inside.sum())
        return Arrivals(ns[inside], order[inside], np.zeros(n, bool), np.zeros(n, np.int64), False)


def window(start_s: float, duration_s: float | None) -> str:
    return f"[{start_s:g}, {'end' if duration_s is None else f'{start_s + duration_s:g}'}) s"


def in_window(ns: np.ndarray, start_s: float, duration_s: float | None) -> np.ndarray:
    inside: np.ndarray = ns >= round(start_s * NS)
    if duration_s is not None:
        inside &= ns < round((start_s + duration_s) * NS)
    return inside


def seconds_ns(seconds: np.ndarray) -> np.ndarray:
    ns: np.ndarray = np.rint(seconds * NS).astype(np.int64)
    return ns
