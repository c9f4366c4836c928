"""Weighted data sets as one request sequence: request i picks its data set with the campaign's seed (the same
draw a template mix makes, np.random.default_rng([seed, i])), and takes that data set's next request in vLLM's
order (source.Deck). Request i is the same whichever worker builds it and however the indices are split."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from loadshapes.datasets.formats import FORMATS
from loadshapes.datasets.source import DatasetSource, Deck
from loadshapes.sessions import Sessions, SessionTurn, Turn, first_turn

if TYPE_CHECKING:
    from loadshapes.tokens import PromptTokenizer

# The keys that make `mix: {dataset: F, ...}` a data set source rather than specdrill's own JSONL.
SOURCE_KEYS = frozenset({"format", "categories", "subset", "category", "output_tokens", "sessions"})


class DatasetEntry(DatasetSource):
    weight: float = Field(default=1.0, gt=0, description="relative share of requests")
    sessions: Sessions | None = Field(
        default=None,
        description="play each conversation's later user turns as a session (docs/operator/traffic.md); "
        "default: the first turn only, as vLLM's bench sends",
    )

    def source(self) -> DatasetSource:
        """What the requests are drawn from (weight and sessions say how they are sent)."""
        return DatasetSource.model_validate(self.model_dump(exclude={"weight", "sessions"}))


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


def _positions(entries: Sequence[DatasetEntry], wanted: list[int], seed: int) -> list[tuple[int, int]]:
    """(entry, place in that entry's sequence) of each wanted request."""
    if len(entries) == 1:
        return [(0, i) for i in wanted]
    picks = _picks(tuple(e.weight for e in entries), seed, max(wanted, default=-1) + 1)
    # Request i's place in its entry's sequence: how many requests before it took the same entry.
    counts = [np.cumsum(np.array(picks) == e) for e in range(len(entries))]
    return [(picks[i], int(counts[picks[i]][i]) - 1) for i in wanted]


def dataset_requests(
    entries: Sequence[DatasetEntry], indices: Iterable[int], seed: int, tokenizer: PromptTokenizer | None
) -> list[dict[str, Any]]:
    """Requests `indices` as RequestSpec fields (category, prompt, prompt_tokens, max_tokens, output_tokens)."""
    wanted = list(indices)
    out: list[dict[str, Any]] = []
    with _LOCK:
        sources = [e.source() for e in entries]
        for e, k in _positions(entries, wanted, seed):
            record, prompt_tokens, output_tokens = _deck(sources[e], seed, tokenizer).request(k)
            out.append({
                "category": sources[e].label(record), "prompt": record.prompt, "prompt_tokens": prompt_tokens,
                "max_tokens": output_tokens, "output_tokens": output_tokens,
            })  # fmt: skip
    return out


def dataset_sessions(
    entries: Sequence[DatasetEntry], indices: Iterable[int], seed: int, tokenizer: PromptTokenizer | None
) -> list[SessionTurn | None]:
    """The first turn of each request's session (None: its entry plays single turns), with the turns to come:
    the conversation's later user turns, each asking the data set's reply length (ShareGPT: its tokens; a format
    without replies: the entry's output_tokens, else the format's default). A ShareGPT conversation ending in a
    user turn without a reply stops before it (no output length to ask)."""
    wanted = list(indices)
    out: list[SessionTurn | None] = []
    with _LOCK:
        for i, (e, k) in zip(wanted, _positions(entries, wanted, seed), strict=True):
            entry = entries[e]
            if entry.sessions is None:
                out.append(None)
                continue
            deck = _deck(entry.source(), seed, tokenizer)
            record = deck.request(k)[0]
            limit = (entry.sessions.max_turns or len(record.later) + 1) - 1
            later: list[Turn] = []
            for user, reply in record.later[:limit]:
                default = FORMATS[deck.fmt].default_output_tokens
                output = entry.output_tokens or (deck.count(reply) if reply is not None else default)
                if output is None or output < 1:
                    break
                later.append(Turn(prompt=user, prompt_tokens=max(1, deck.count(user)), max_tokens=output))
            out.append(first_turn(i, record.prompt, tuple(later), entry.sessions.think_time_s, entry.max_model_len))
    return out
