"""What the CSV traces with lengths (azure, burstgpt) share: a header that names them, pyarrow's streaming CSV
reader, and per-cell checks that name the first bad row."""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Generator, Iterator
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from loadshapes import limits
from loadshapes.replay_formats.base import Probe
from loadshapes.replay_formats.lines import csv_reader, csv_rows
from loadshapes.replay_formats.streaming import StreamedFormat, locate, numbered
from loadshapes.trace import filesystem

# pyarrow's read block. A streaming reader's pool peaked near 40x its block here (a 4 MiB block: 160 MiB, 256 KiB:
# 10 MiB) on a 5M-row BurstGPT file, with no gain in speed.
CSV_BLOCK_BYTES = 256 << 10

CellCheck = Callable[[str], "str | None"]


class CsvTraceFormat(StreamedFormat):
    # The header's columns that name the format (a header holding them all is this format).
    columns: ClassVar[tuple[str, ...]]
    # The columns replay reads (read as strings so that a bad cell is found by the checks here, not lost inside a
    # conversion error that does not say its row).
    read_columns: ClassVar[tuple[str, ...]]

    @abstractmethod
    def cell_checks(self) -> dict[str, CellCheck]:
        """Per field: what is wrong with a cell (None when it is fine). The same rules as the batch checks."""

    def detects(self, probe: Probe) -> bool:
        return set(self.columns) <= probe.header

    def batches(self, path: str) -> Generator[tuple[int, pa.RecordBatch], None, None]:
        fs, base = filesystem(path)
        need = self.read_columns
        with fs.open_input_stream(base) as stream:
            try:
                reader = pacsv.open_csv(
                    stream,
                    read_options=pacsv.ReadOptions(block_size=max(CSV_BLOCK_BYTES, limits.current().line_bytes + 1)),
                    convert_options=pacsv.ConvertOptions(
                        include_columns=list(need), column_types=dict.fromkeys(need, pa.string())
                    ),
                )
                yield from numbered(reader)
            except (pa.ArrowInvalid, KeyError) as exc:
                raise locate(path, self, str(exc)) from None

    def first_bad_row(self, lines: Iterator[str], path: str) -> str | None:
        reader = csv_reader(lines)
        checks = self.cell_checks()
        header: list[str] | None = None
        for row in csv_rows(reader, path):
            if not any(c.strip() for c in row):
                continue
            if header is None:
                header = row
                missing = [name for name in checks if name not in header]
                if missing:
                    return f"{reader.line_num}: no column {missing[0]!r} in the header ({', '.join(header)})"
                continue
            if len(row) != len(header):
                return f"{reader.line_num}: expected {len(header)} fields, got {len(row)}"
            for name, check in checks.items():
                problem = check(row[header.index(name)].strip())
                if problem is not None:
                    return f"{reader.line_num}: {name}: {problem}"
        return None if header is not None else "1: empty, expected a header"


def count(cell: str) -> str | None:
    try:
        value = int(cell)
    except ValueError:
        return f"{cell!r} is not a whole number of tokens"
    return f"{cell!r} is negative" if value < 0 else None


def seconds(cell: str) -> str | None:
    try:
        value = float(cell)
    except ValueError:
        return f"{cell!r} is not a number of seconds"
    return None if math.isfinite(value) else f"{cell!r} is not a finite number"


def stamp(cell: str) -> str | None:
    for kind in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
        try:
            pc.cast(pa.array([cell]), kind)
            return None
        except pa.ArrowInvalid:
            continue
    return f"{cell!r} is not a date-time (YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM])"


def text(cell: str) -> str | None:
    return None
