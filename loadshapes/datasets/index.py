"""A data set file read once, in bounded memory: the byte offset of each row a sampler may send (after the row
filters vLLM applies before it shuffles: ShareGPT's two turns, a category), each row checked against its format's
model so a bad row is one line before anything runs."""

from __future__ import annotations

import functools
import os
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from loadshapes.datasets.formats import FORMATS, DatasetFormat, speed_bench_file
from loadshapes.datasets.reading import DatasetError, array_records, line_records, record_at
from loadshapes.datasets.records import Record

# The `from` of a person's turn in a ShareGPT entry (ShareGPT V3 writes human; a few entries write user).
HUMAN = frozenset({"human", "user"})


@dataclass(frozen=True)
class Index:
    path: str  # the file read (a SPEED-Bench directory's subset file)
    fmt: DatasetFormat
    offsets: array[int]  # int64 byte offsets of the kept rows, in file order
    jsonl: bool

    def __len__(self) -> int:
        return len(self.offsets)

    def record(self, row: int) -> Record:
        """Kept row `row` (0-based, file order), decoded again from the file."""
        data = record_at(self.path, self.offsets[row], self.jsonl)
        model: Any = FORMATS[self.fmt].row.model_validate(data)
        record: Record = model.record()
        return record

    def records(self) -> Iterator[Record]:
        """Every kept row in file order, in one pass over the file (not a seek per row)."""
        wanted = iter(self.offsets)
        next_offset = next(wanted, None)
        for offset, _, data in _rows(self.path, self.jsonl):
            if offset != next_offset:
                continue
            model: Any = FORMATS[self.fmt].row.model_validate(data)
            yield model.record()
            next_offset = next(wanted, None)
            if next_offset is None:
                return


def _rows(path: str, jsonl: bool) -> Iterator[tuple[int, str, Any]]:
    """(offset, where for messages, data) of every record."""
    if jsonl:
        for offset, number, data in line_records(path):
            yield offset, f"{path}:{number}", data
    else:
        for n, (offset, data) in enumerate(array_records(path), start=1):
            yield offset, f"{path}: record {n}", data


def _problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(p) for p in error['loc']) or 'the record'}: {error['msg']}"


@functools.lru_cache(maxsize=16)
def index(path: str, fmt: DatasetFormat, categories: tuple[str, ...] | None, subset: str) -> Index:
    """The rows of `path` a sampler may send. Cached per file version (the caller passes what identifies it)."""
    spec = FORMATS[fmt]
    if spec.container == "directory":
        if not os.path.isdir(path):
            raise DatasetError(f"{path}: a speed_bench data set is the directory SPEED-Bench's prepare.py writes")
        path = speed_bench_file(path, subset)
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: no such data set file")
    jsonl = spec.container != "array"
    model: type[BaseModel] = spec.row
    kept: array[int] = array("q")
    seen: Counter[str] = Counter()
    human = 0  # ShareGPT entries with a human turn
    for offset, where, data in _rows(path, jsonl):
        if not isinstance(data, dict):
            raise DatasetError(f"{where}: expected a JSON object ({fmt}), found {type(data).__name__}")
        if fmt == "sharegpt":
            turns = data.get("conversations") or ()
            if len(turns) < 2:
                continue  # vLLM drops entries with fewer than two turns before it shuffles
            human += any(isinstance(t, dict) and t.get("from") in HUMAN for t in turns)
        try:
            row: Any = model.model_validate(data)
        except ValidationError as exc:
            raise DatasetError(f"{where}: not a {fmt} row: {_problem(exc)}") from None
        category = row.record().category
        seen[category or "(none)"] += 1
        if categories is not None and category not in categories:
            continue
        kept.append(offset)
    if not kept:
        if categories is not None:
            found = ", ".join(f"{c} ({n})" for c, n in sorted(seen.items())) or "none"
            raise DatasetError(f"{path}: no {fmt} rows in categories {', '.join(categories)}; the file has {found}")
        raise DatasetError(f"{path}: no {fmt} rows to send" + (" (none with two turns)" if fmt == "sharegpt" else ""))
    if fmt == "sharegpt" and not human:
        # An entry is sent as vLLM sends it, turn 0 as the prompt whoever speaks it (a third of ShareGPT V3's
        # entries start with the model's turn); a file where no entry has a person's turn is not conversations.
        raise DatasetError(
            f"{path}: none of its {len(kept):,} sharegpt entries with two turns has a human turn (`from`: "
            f"{' or '.join(sorted(HUMAN))}): not ShareGPT conversations"
        )
    return Index(path, fmt, kept, jsonl)
