"""csv: timestamps in seconds (absolute epoch or relative), one per line or in a named column of a header; the
format every file that no other format recognises is read as."""

from __future__ import annotations

import array
import math

import numpy as np

from loadshapes import limits
from loadshapes.replay_formats.base import OneFileFormat, Probe, TraceError, seconds_ns
from loadshapes.replay_formats.lines import bounded_lines, csv_reader, csv_rows


class TimestampCsv(OneFileFormat):
    name = "csv"

    def detects(self, probe: Probe) -> bool:
        return True

    def arrival_ns(self, path: str, column: str | None, arm: str | None, shape: str | None) -> np.ndarray:
        if arm is not None or shape is not None:
            raise TraceError(f"{path}: arm and shape pick from a trace, not a CSV")
        return csv_ns(path, column)


FORMAT = TimestampCsv()


def csv_ns(path: str, column: str | None) -> np.ndarray:
    """Timestamps in seconds (absolute epoch or relative), one per line or in the named column of a header.

    Streamed a bounded line at a time into an array of doubles (8 bytes a row, up to limits.replay_rows)."""
    most = limits.current().replay_rows
    lines = bounded_lines(path)
    reader = csv_reader(lines)
    need_header, index, width = column is not None, 0, 1
    values = array.array("d")
    for row in csv_rows(reader, path):
        cells = [c.strip() for c in row]
        if not any(cells):
            continue
        where = f"{path}:{reader.line_num}"
        if need_header:
            if column not in cells:
                raise TraceError(f"{where}: no column {column!r} in the header ({', '.join(cells)})")
            need_header, index, width = False, cells.index(column), len(cells)
            continue
        if len(cells) != width:
            hint = "" if column else "; name the column to read with column"
            raise TraceError(f"{where}: expected {width} fields, got {len(cells)}{hint}")
        try:
            value = float(cells[index])
        except ValueError:
            hint = " (a header? name the column with column)" if column is None and not values else ""
            raise TraceError(f"{where}: {cells[index]!r} is not a number{hint}") from None
        if not math.isfinite(value):
            raise TraceError(f"{where}: {cells[index]!r} is not a finite number")
        if value < 0:
            raise TraceError(f"{where}: {cells[index]!r} is negative")
        if len(values) >= most:
            raise TraceError(f"{where}: more than {limits.figure(most)} arrivals (limit replay_rows; raise it with "
                             f"{limits.raise_hint('replay_rows', most * 10)})")  # fmt: skip
        values.append(value)
    if need_header:
        raise TraceError(f"{path}: empty, expected a header naming {column!r}")
    if not values:
        raise TraceError(f"{path}: no arrivals")
    return seconds_ns(np.frombuffer(values, dtype=np.float64))
