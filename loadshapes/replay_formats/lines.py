"""Reading a replay file a bounded line at a time (limits.line_kib), for the CSV of timestamps and for naming the
first bad row of a trace whose batch failed."""

from __future__ import annotations

import csv
import io
from collections.abc import Generator, Iterator
from typing import Any

from loadshapes import limits
from loadshapes.replay_formats.base import TraceError
from loadshapes.trace import filesystem


def bounded_lines(path: str) -> Generator[str, None, None]:
    """The file's lines as text, each read with a bound (limits.line_kib): a line over it, or bytes that are not
    UTF-8, end the read in one line naming the file and line, before a longer line is ever held."""
    most = limits.current().line_bytes
    fs, base = filesystem(path)
    with fs.open_input_stream(base) as raw:
        lines = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        number = 0
        while True:
            number += 1
            try:
                line = lines.readline(most + 1)
            except UnicodeDecodeError as exc:
                raise TraceError(f"{path}:{number}: not UTF-8 text ({exc.reason})") from None
            if not line:
                return
            if len(line) > most and not line.endswith(("\n", "\r")):
                raise TraceError(
                    f"{path}:{number}: a line longer than {limits.figure(most)} characters (limit line_kib = "
                    f"{limits.current().line_kib:g}; raise it with {limits.raise_hint('line_kib', 10 * most / 1024)})"
                )
            yield line


def csv_reader(lines: Iterator[str]) -> Any:
    # A field may be as long as a line may be (csv's own bound is 128 KiB, process-wide)
    csv.field_size_limit(max(csv.field_size_limit(), limits.current().line_bytes))
    return csv.reader(lines)


def csv_rows(reader: Any, path: str) -> Iterator[list[str]]:
    """The reader's rows, or one line naming the line it could not split (a NUL, a stray carriage return)."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: not a CSV line ({exc})") from None
        yield row
