"""azure: the Azure LLM inference traces 2023 / 2024, CSV `TIMESTAMP, ContextTokens, GeneratedTokens`, arrival
times as date-times."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadshapes.replay_formats import csv_traces
from loadshapes.replay_formats.csv_traces import CellCheck, CsvTraceFormat
from loadshapes.replay_formats.streaming import numbers

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class Azure(CsvTraceFormat):
    name = "azure"
    rule_keys = ("file",)  # the file's name: Azure's code and conversation files
    columns = AZURE_COLUMNS
    read_columns = AZURE_COLUMNS

    def arrival_columns(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        ns = _datetime_ns(batch.column("TIMESTAMP"))
        return ns, np.zeros(len(ns), bool)

    def length_columns(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        prompts = numbers(batch.column("ContextTokens"), pa.int64())
        outputs = numbers(batch.column("GeneratedTokens"), pa.int64())
        return prompts, outputs, {}

    def cell_checks(self) -> dict[str, CellCheck]:
        return {"TIMESTAMP": csv_traces.stamp, "ContextTokens": csv_traces.count, "GeneratedTokens": csv_traces.count}


FORMAT = Azure()


def _datetime_ns(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Azure's date-times: 2023's have no zone (`2023-11-16 18:15:46.6805900`), 2024's mostly end in `+00:00`.

    Arrow casts a column either with zones or without; a batch that mixes them is cast in two parts."""
    if column.null_count:
        raise ValueError("missing value")
    zoned = np.asarray(pc.match_substring_regex(column, r"(Z|[+-]\d\d:?\d\d)$").to_numpy(zero_copy_only=False))
    out = np.empty(len(column), dtype=np.int64)
    for mask, kind in ((zoned, pa.timestamp("ns", tz="UTC")), (~zoned, pa.timestamp("ns"))):
        if mask.any():
            part = pc.cast(pc.filter(column, pa.array(mask)), kind).cast(pa.int64())
            out[mask] = np.asarray(part.to_numpy(zero_copy_only=False))
    return out
