"""The data set formats, how a file is recognised as one (the way a replay trace's format is detected), and what
each needs where its rows carry no output length (vLLM's default for the same `--dataset-name`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from loadshapes.datasets import records
from loadshapes.datasets.reading import DatasetError

DatasetFormat = Literal[
    "specdrill", "sharegpt", "spec_bench", "speed_bench", "custom", "mt_bench", "humaneval", "gsm8k",
    "instructcoder", "openai_chat", "openai_completions",
]  # fmt: skip


@dataclass(frozen=True)
class FormatSpec:
    row: type[BaseModel]
    container: Literal["array", "jsonl", "directory"]
    # vLLM's output length where a row has none (its --*-output-len default, or the class's DEFAULT_OUTPUT_LEN).
    default_output_tokens: int | None
    # Keys of the first record that say the file is this format (checked in FORMATS' order); None: by name only.
    keys: frozenset[str] | None


FORMATS: dict[DatasetFormat, FormatSpec] = {
    # specdrill's own JSONL first: its rows also carry `prompt` and `max_tokens`, as a logged completion does.
    "specdrill": FormatSpec(records.SpecdrillRow, "jsonl", None, frozenset({"category", "prompt", "max_tokens"})),
    "sharegpt": FormatSpec(records.ShareGPTEntry, "array", None, None),  # a JSON list: recognised by its `[`
    "spec_bench": FormatSpec(records.SpecBenchQuestion, "jsonl", 256, frozenset({"question_id", "category", "turns"})),
    "speed_bench": FormatSpec(records.SpeedBenchRow, "directory", 4096, None),  # a directory
    "openai_chat": FormatSpec(records.ChatBody, "jsonl", 256, frozenset({"messages"})),
    "humaneval": FormatSpec(records.HumanEvalRow, "jsonl", 256, frozenset({"task_id", "prompt"})),
    "gsm8k": FormatSpec(records.GSM8KRow, "jsonl", 256, frozenset({"question", "answer"})),
    "instructcoder": FormatSpec(records.InstructCoderRow, "jsonl", 200, frozenset({"instruction", "input"})),
    "openai_completions": FormatSpec(records.CompletionBody, "jsonl", None, frozenset({"prompt", "max_tokens"})),
    "custom": FormatSpec(records.CustomRow, "jsonl", 256, frozenset({"prompt"})),
    # philschmid/mt-bench has Spec-Bench's columns (question_id, category, turns): named with `format:` only.
    "mt_bench": FormatSpec(records.MTBenchRow, "jsonl", 256, None),
}


def speed_bench_file(directory: str, subset: str) -> str:
    """A prepared SPEED-Bench directory's subset file, as vLLM's SpeedBench opens it."""
    return os.path.join(directory, f"{subset}.jsonl")


def detect(path: str) -> DatasetFormat:
    """The format of `path` from what it is (a directory) and its first record; one line naming the file and the
    formats tried where none fits."""
    if not os.path.exists(path):
        raise DatasetError(f"{path}: no such data set file or directory")
    if os.path.isdir(path):
        return "speed_bench"
    with open(path, "rb") as handle:
        head = handle.read(64 << 10)
    text = head.decode("utf-8-sig", errors="replace").lstrip()
    if text.startswith("["):
        return "sharegpt"
    first = text.split("\n", 1)[0].strip()
    try:
        keys = set(json.loads(first)) if first.startswith("{") else None
    except json.JSONDecodeError:
        keys = None
    if keys is not None:
        for name, spec in FORMATS.items():
            if spec.keys is not None and spec.keys <= keys:
                return name
    tried = ", ".join(f"{n} ({'+'.join(sorted(s.keys))})" for n, s in FORMATS.items() if s.keys is not None)
    what = f"a JSON object with keys {', '.join(sorted(keys))}" if keys is not None else "no JSON object"
    raise DatasetError(
        f"{path}: not a data set in any known format: its first line is {what}; tried sharegpt (a JSON list), "
        f"speed_bench (a directory), {tried}; name one with `format:`"
    )
