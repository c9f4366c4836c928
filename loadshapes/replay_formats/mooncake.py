"""mooncake: Mooncake's JSONL, `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (prefix blocks)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from loadshapes import limits
from loadshapes.replay_formats.base import Probe, seconds_ns
from loadshapes.replay_formats.streaming import StreamedFormat, locate, numbered, numbers
from loadshapes.trace import filesystem

MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
# JSON lines (Mooncake's hash_ids) must fit in one block.
_JSON_BLOCK_BYTES = 1 << 20


class Mooncake(StreamedFormat):
    name = "mooncake"
    rule_keys = ("file",)
    prefix_blocks = True

    def detects(self, probe: Probe) -> bool:
        return probe.text.startswith("{")

    def batches(self, path: str) -> Generator[tuple[int, pa.RecordBatch], None, None]:
        fs, base = filesystem(path)
        schema = pa.schema([
            ("timestamp", pa.float64()), ("input_length", pa.int64()), ("output_length", pa.int64()),
            ("hash_ids", pa.list_(pa.int64())),
        ])  # fmt: skip
        options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        with fs.open_input_stream(base) as stream:
            try:
                block = max(_JSON_BLOCK_BYTES, limits.current().line_bytes + 1)  # a line fits in one block
                reader = pajson.open_json(stream, read_options=pajson.ReadOptions(block_size=block),
                                          parse_options=options)  # fmt: skip
                yield from numbered(reader)
            except pa.ArrowInvalid as exc:
                raise locate(path, self, str(exc)) from None

    def arrival_columns(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        ms = numbers(batch.column("timestamp"), pa.float64())
        return seconds_ns(ms / 1000.0), np.zeros(len(ms), bool)

    def length_columns(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        prompts = numbers(batch.column("input_length"), pa.int64())
        outputs = numbers(batch.column("output_length"), pa.int64())
        hashes = batch.column("hash_ids")
        if hashes.null_count:
            raise ValueError("missing hash_ids")
        flat = hashes.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
        if np.any(flat < 0):
            raise ValueError("negative hash id")
        cuts = hashes.offsets.to_numpy()
        return prompts, outputs, {"hash_ids": [flat[a:b] for a, b in itertools.pairwise(cuts)]}

    def first_bad_row(self, lines: Iterator[str], path: str) -> str | None:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                return f"{number}: not JSON: {exc.msg}"
            if not isinstance(data, dict):
                return f"{number}: not a JSON object"
            for name in MOONCAKE_FIELDS:
                value = data.get(name)
                if name == "hash_ids":
                    if not isinstance(value, list) or not all(type(h) is int and h >= 0 for h in value):
                        return f"{number}: hash_ids: {value!r} is not a list of integers >= 0"
                elif name == "timestamp":
                    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                        return f"{number}: timestamp: {value!r} is not a number of milliseconds"
                elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    return f"{number}: {name}: {value!r} is not a whole number of tokens >= 0"
        return None


FORMAT = Mooncake()
