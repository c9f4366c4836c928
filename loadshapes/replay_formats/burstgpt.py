"""burstgpt: BurstGPT, CSV `Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type`, seconds
from the trace's start; 0 response tokens is a failed request."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from loadshapes.replay_formats import csv_traces
from loadshapes.replay_formats.base import seconds_ns
from loadshapes.replay_formats.csv_traces import CellCheck, CsvTraceFormat
from loadshapes.replay_formats.streaming import numbers

BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")


class BurstGPT(CsvTraceFormat):
    name = "burstgpt"
    rule_keys = ("file", "model", "log_type")
    columns = BURSTGPT_COLUMNS
    read_columns = tuple(c for c in BURSTGPT_COLUMNS if c != "Total tokens")

    def arrival_columns(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        seconds = numbers(batch.column("Timestamp"), pa.float64())
        responses = numbers(batch.column("Response tokens"), pa.int64())
        if np.any(responses < 0):
            raise ValueError("negative")
        return seconds_ns(seconds), responses == 0

    def length_columns(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        prompts = numbers(batch.column("Request tokens"), pa.int64())
        outputs = numbers(batch.column("Response tokens"), pa.int64())
        out = {
            "model": np.asarray(batch.column("Model").to_pylist(), dtype=object),
            "log_type": np.asarray(batch.column("Log Type").to_pylist(), dtype=object),
        }
        return prompts, outputs, out

    def cell_checks(self) -> dict[str, CellCheck]:
        return {
            "Timestamp": csv_traces.seconds, "Model": csv_traces.text, "Request tokens": csv_traces.count,
            "Response tokens": csv_traces.count, "Log Type": csv_traces.text,
        }  # fmt: skip


FORMAT = BurstGPT()
