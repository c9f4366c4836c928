"""Seeded prompt text for each workload category, generated here: nothing is downloaded.

Lengths are in whitespace-separated words, which the simulated engine counts as tokens; real tokenizers give
somewhat more tokens per word, so a prompt's `prompt_tokens` is a target, not a promise, against vLLM.
"""

from __future__ import annotations

import numpy as np

_NOUNS = (
    "apples", "boxes", "pencils", "tickets", "marbles", "books", "cookies", "coins", "stamps", "bottles",
    "chairs", "lamps", "shirts", "cards", "plants", "cups", "keys", "bricks", "tiles", "ropes",
)  # fmt: skip
_NAMES = ("Ada", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kemi", "Liam")
_TOPICS = (
    "speculative decoding", "continuous batching", "the KV cache", "load testing", "queueing delay",
    "tail latency", "GPU utilisation", "request routing", "data parallelism", "token budgets",
)  # fmt: skip
_CODE = (
    "def total(items):", "    result = 0", "    for item in items:", "        result += item.price * item.count",
    "    return result", "", "class Cart:", "    def __init__(self):", "        self.items = []",
    "    def add(self, item):", "        self.items.append(item)", "    def clear(self):", "        self.items = []",
)  # fmt: skip


def _fill(words: list[str], target: int, rng: np.random.Generator, filler: tuple[str, ...]) -> str:
    if len(words) < target:
        # One draw for all the filler (every filler phrase has >= 1 word), not one per phrase: prompts are built
        # for every scheduled request ahead of the run.
        for index in rng.integers(0, len(filler), size=target - len(words)):
            words.extend(filler[index].split())
            if len(words) >= target:
                break
    return " ".join(words[:target])


def reasoning_prompt(target_words: int, rng: np.random.Generator) -> str:
    name, other = rng.choice(_NAMES, size=2, replace=False)
    noun = rng.choice(_NOUNS)
    a, b, c = (int(x) for x in rng.integers(2, 60, size=3))
    problem = (
        f"Question: {name} has {a} {noun}. {other} gives {name} {b} more and then {name} sells {c}. "
        f"How many {noun} does {name} have now? Think step by step and show every calculation."
    ).split()
    shots = [
        "Question:",
        "a",
        "shop",
        "has",
        "12",
        "boxes",
        "and",
        "sells",
        "5",
        "of",
        "them.",
        "How",
        "many",
        "are",
        "left?",
        "Answer:",
        "12",
        "-",
        "5",
        "=",
        "7.",
    ]
    words: list[str] = []
    while len(words) + len(problem) < target_words:
        words.extend(shots)
    return " ".join([*words[: max(0, target_words - len(problem))], *problem])


def chat_prompt(target_words: int, rng: np.random.Generator) -> str:
    topic = rng.choice(_TOPICS)
    return _fill(f"Can you explain {topic} in simple terms?".split(), target_words, rng, _TOPICS)


def editing_prompt(target_words: int, rng: np.random.Generator) -> str:
    """A document plus an instruction to reproduce it with small changes: drafts from the prompt accept well."""
    old, new = rng.choice(["result", "total", "items", "price"], size=2, replace=False)
    instruction = f"Rewrite the code below exactly, renaming {old} to {new} and changing nothing else:".split()
    code: list[str] = []
    while len(instruction) + len(code) < target_words:
        code.extend(" ".join(_CODE).split())
    return " ".join([*instruction, *code][:target_words])


PROMPT_BUILDERS = {"reasoning": reasoning_prompt, "chat": chat_prompt, "editing": editing_prompt}
