"""Weighted data sets as one request sequence: request i picks its data set with the campaign's seed (the same
draw a template mix makes, np.random.default_rng([seed, i])), and takes that data set's next request in vLLM's
order (source.Deck). Request i is the same whichever worker builds it and however the indices are split."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from loadshapes.datasets.source import DatasetSource, Deck

if TYPE_CHECKING:
    from loadshapes.tokens import PromptTokenizer

# The keys that make `mix: {dataset: F, ...}` a data set source rather than specdrill's own JSONL.
SOURCE_KEYS = frozenset({"format", "categories", "subset", "category", "output_tokens"})


class DatasetEntry(DatasetSource):
    weight: float = Field(default=1.0, gt=0, description="relative share of requests")


_LOCK = threading.Lock()
_DECKS: dict[tuple[DatasetSource, int, tuple[str, bool] | None], Deck] = {}
_PICKS: dict[tuple[tuple[float, ...], int], list[int]] = {}


def _deck(source: DatasetSource, seed: int, tokenizer: PromptTokenizer | None) -> Deck:
    # By the tokenizer's identity (name, special tokens), not the object's: the same counts give the same deck.
    key = (source, seed, None if tokenizer is None else (tokenizer.name, tokenizer.add_special_tokens))
    deck = _DECKS.get(key)
    if deck is None:
        if len(_DECKS) > 32:
            _DECKS.clear()
        deck = _DECKS[key] = Deck(source, seed, tokenizer)
    return deck


def _picks(weights: tuple[float, ...], seed: int, upto: int) -> list[int]:
    """Which entry requests 0..upto-1 take (the draws a template mix makes), kept per (weights, seed)."""
    picks = _PICKS.setdefault((weights, seed), [])
    cumulative = np.cumsum(np.array(weights) / sum(weights))
    for i in range(len(picks), upto):
        draw = np.random.default_rng([seed, i]).random()
        picks.append(min(int(np.searchsorted(cumulative, draw, side="right")), len(weights) - 1))
    return picks


def dataset_requests(
    entries: Sequence[DatasetEntry], indices: Iterable[int], seed: int, tokenizer: PromptTokenizer | None
) -> list[dict[str, Any]]:
    """Requests `indices` as RequestSpec fields (category, prompt, prompt_tokens, max_tokens, output_tokens)."""
    wanted = list(indices)
    out: list[dict[str, Any]] = []
    with _LOCK:
        sources = [DatasetSource.model_validate(e.model_dump(exclude={"weight"})) for e in entries]
        if len(entries) == 1:
            positions = [(0, i) for i in wanted]
        else:
            picks = _picks(tuple(e.weight for e in entries), seed, max(wanted, default=-1) + 1)
            # Request i's place in its entry's sequence: how many requests before it took the same entry.
            counts = [np.cumsum(np.array(picks) == e) for e in range(len(entries))]
            positions = [(picks[i], int(counts[picks[i]][i]) - 1) for i in wanted]
        for e, k in positions:
            record, prompt_tokens, output_tokens = _deck(sources[e], seed, tokenizer).request(k)
            out.append({
                "category": sources[e].label(record), "prompt": record.prompt, "prompt_tokens": prompt_tokens,
                "max_tokens": output_tokens, "output_tokens": output_tokens,
            })  # fmt: skip
    return out
