"""The replay formats, in the order detection asks them, and the entry points that look a format up by name."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loadshapes.replay_formats import azure, burstgpt, mooncake, specdrill, timestamps
from loadshapes.replay_formats.base import Arrivals, Contents, Format, ReplayFormat, probe

# Detection order: a directory or Parquet is a trace, `{` starts Mooncake JSONL, a header naming Azure's or
# BurstGPT's columns is that, anything else is a timestamp CSV (last: it takes any file).
FORMATS: dict[Format, ReplayFormat] = {
    f.name: f for f in (specdrill.FORMAT, mooncake.FORMAT, azure.FORMAT, burstgpt.FORMAT, timestamps.FORMAT)
}
# What a category rule can look at, per format.
RULE_KEYS: dict[Format, tuple[str, ...]] = {name: f.rule_keys for name, f in FORMATS.items()}


def detect_format(path: str) -> Format:
    """The format from the path and the first line (the first format in FORMATS that recognises it)."""
    seen = probe(path)
    return next(name for name, f in FORMATS.items() if f.detects(seen))


def read_arrivals(
    paths: Sequence[str],
    fmt: Format,
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    keep_failed: bool = False,
    column: str | None = None,
    arm: str | None = None,
    shape: str | None = None,
) -> Arrivals:
    """The arrivals inside [start_s, start_s + duration_s) of the trace's own seconds from its first arrival.

    Several files of one format (Azure's code and conversation traces) are one trace, merged by time."""
    return FORMATS[fmt].read_arrivals(
        paths, start_s=start_s, duration_s=duration_s, keep_failed=keep_failed, column=column, arm=arm, shape=shape
    )


def read_contents(paths: Sequence[str], fmt: Format, files: np.ndarray, rows: np.ndarray) -> Contents:
    """The recorded lengths (and rule keys, prefix blocks) of rows `rows` of files `files` (indices into paths)."""
    return FORMATS[fmt].read_contents(paths, files, rows)
