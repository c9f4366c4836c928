"""Small data set files in the real formats, written by the tests (a few dozen rows each)."""

from __future__ import annotations

import json
from pathlib import Path

SPEC_CATEGORIES = ("coding", "writing", "math_reasoning", "stem")


def sharegpt(path: Path, n: int = 40) -> Path:
    """ShareGPT V3's shape: a JSON list of {id, conversations: [{from, value}, ...]}; some entries start with the
    assistant, some have one turn (vLLM drops those), some are too short or too long for vLLM's limits."""
    entries = []
    for i in range(n):
        human = {"from": "human", "value": f"Question {i}: " + "tell me about the sea, café ✓ 日本 " * (1 + i % 9)}
        gpt = {"from": "gpt", "value": "The sea is wide and deep. " * (1 + i % 13)}
        turns = [human, gpt, {"from": "human", "value": "and then?"}, {"from": "gpt", "value": "more " * 5}]
        if i % 10 == 3:
            turns = [gpt, human]  # ShareGPT V3 holds entries that start with the assistant
        if i % 10 == 7:
            turns = [human]  # one turn
        if i % 17 == 5:
            human = {"from": "human", "value": "hi"}  # under 4 tokens: vLLM skips it
            turns = [human, gpt]
        if i == 11:
            turns = [{"from": "human", "value": "word " * 1100}, gpt]  # over 1024 prompt tokens
        entries.append({"id": f"e{i}", "conversations": turns})
    path.write_text(json.dumps(entries, indent=2, ensure_ascii=False))
    return path


def spec_bench(path: Path, n: int = 32) -> Path:
    rows = [
        {"question_id": i, "category": SPEC_CATEGORIES[i % len(SPEC_CATEGORIES)],
         "turns": [f"Spec-Bench question {i}: write {i % 5 + 2} lines about topic {i}.", "a second turn"]}
        for i in range(n)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
