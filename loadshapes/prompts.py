"""Seeded prompt text for each workload category, generated here: nothing is downloaded.

Lengths here are in whitespace-separated words, which the simulated engine counts as tokens; where the served
model's tokenizer is known, loadshapes/tokens.py fits these texts to an exact token count instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

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


@dataclass(frozen=True)
class PrefixBlocks:
    """A prompt made of shared blocks (Mooncake's hash_ids): requests with the same leading ids share that prefix.
    `copy` > 0 (a copy rate scaling added) makes the last block its own, as a different request's would be."""

    hash_ids: tuple[int, ...]
    block_tokens: int
    copy: int = 0


_PREFIX_KEY = 0x50524546  # separates prefix-block seeds from request seeds ([seed, i])


def prefixed_prompt(prefix: PrefixBlocks, target_words: int, seed: int) -> str:
    """A prompt of `target_words` words made of `prefix.block_tokens`-word blocks, block j from hash id j alone.

    Two requests whose hash ids agree up to block j have the same first j + 1 blocks, so a prefix cache sees what
    it saw in the trace. The blocks are neutral chat text whatever the request's category: a shared block must
    read the same in every request that holds it. Words past the last block (a trace with fewer hash ids than its
    length needs), and a copy's last block, are the request's own.
    """
    ids = prefix.hash_ids or (0,)
    size = prefix.block_tokens
    needed = max(1, -(-target_words // size))
    texts: list[str] = []
    for j in range(needed):
        beyond = max(0, j - len(ids) + 1)
        hash_id = ids[min(j, len(ids) - 1)]
        if beyond or (prefix.copy and j >= len(ids) - 1):
            texts.append(_block_text(seed, hash_id, beyond, prefix.copy, size))
        else:
            texts.append(_shared_block(seed, hash_id, size))
    tail = target_words - size * (needed - 1)
    if tail < size:
        texts[-1] = " ".join(texts[-1].split()[:tail])
    return " ".join(texts)


def _block_text(seed: int, hash_id: int, beyond: int, copy: int, words: int) -> str:
    """Exactly `words` words (chat_prompt fills to its target), from (seed, hash id) alone when shared."""
    key = [seed, _PREFIX_KEY, hash_id] if not (beyond or copy) else [seed, _PREFIX_KEY, hash_id, beyond, copy]
    return chat_prompt(words, np.random.default_rng(key))


@functools.lru_cache(maxsize=4096)
def _shared_block(seed: int, hash_id: int, words: int) -> str:
    # Shared blocks recur (Mooncake's system prompts lead most requests); 4096 cached blocks of 512 words are
    # about 15 MB of text, where caching every block of a worker's share could hold its whole prompt text again.
    return _block_text(seed, hash_id, 0, 0, words)
