"""Seeded prompt text for each workload category, generated here: nothing is downloaded.

Lengths are in whitespace-separated words, which the simulated engine counts as tokens; real tokenizers give
somewhat more tokens per word, so a prompt's `prompt_tokens` is a target, not a promise, against vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from loadshapes.mixes import PrefixBlocks

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


_PREFIX_KEY = 0x50524546  # separates prefix-block seeds from request seeds ([seed, i])


def prefixed_prompt(prefix: PrefixBlocks, target_words: int, seed: int, built: dict[tuple[int, int], list[str]]) -> str:
    """A prompt of `target_words` words made of `prefix.block_tokens`-word blocks, block j from hash id j alone.

    Two requests whose hash ids agree up to block j have the same first j + 1 blocks, so a prefix cache sees what
    it saw in the trace. The blocks are neutral chat text whatever the request's category: a shared block must
    read the same in every request that holds it. Words past the last block (a trace with fewer hash ids than its
    length needs) come from the last id's continuation, so they are not shared. `built` caches blocks.
    """
    words: list[str] = []
    ids = list(prefix.hash_ids) or [0]
    needed = max(1, -(-target_words // prefix.block_tokens))
    for j in range(needed):
        own = j >= len(ids) - 1 and prefix.copy > 0  # a copy's last block (and beyond) is not shared
        key = (ids[min(j, len(ids) - 1)], j - len(ids) + 1 if j >= len(ids) else 0)
        if own or j >= len(ids):
            salt = [seed, _PREFIX_KEY, key[0], key[1], prefix.copy]
            block = chat_prompt(prefix.block_tokens, np.random.default_rng(salt)).split()
        else:
            if key not in built:
                built[key] = chat_prompt(
                    prefix.block_tokens, np.random.default_rng([seed, _PREFIX_KEY, key[0]])
                ).split()
            block = built[key]
        words.extend(block)
        if len(words) >= target_words:
            break
    return " ".join(words[:target_words])
