"""Prompt lengths in a served model's tokens: prompt text built to an exact token count under the model's tokenizer.

The count is the one the server reports as usage.prompt_tokens: the tokenizer run with the special tokens the
server adds. vLLM's completions endpoint tokenizes with add_special_tokens=True, so a Llama's BOS is part of
`prompt_tokens` (a 128-token prompt is BOS + 127 text tokens); its chat endpoint renders the chat template,
which brings its own special tokens, and tokenizes without adding more, so there the count is the message
content's tokens and the server's figure is that plus the template's.

The tokenizer loads once, where the run starts, from local files only (a path, or a Hugging Face id already in
the local cache): nothing is downloaded. Load workers get its serialized form (tokenizer.json) in their plans, so
the nodes they run on need neither the model's files nor transformers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Appended to reach the count when the category's own text falls short by a few tokens: common words, each one
# token in most vocabularies, that survive decode -> encode in byte-level and SentencePiece tokenizers alike.
_PADDING = " the request waits in the queue for the engine to verify the draft tokens of the batch and" * 4
# How far around the exact cut to look when decode -> encode does not give back the tokens cut (a merge or a
# split at the cut): the nearest cut whose text counts exactly wins.
_CUT_SEARCH = 8


class TokenizerUnavailable(ValueError):
    """The named tokenizer cannot be loaded from local files."""


class PromptTokenizer:
    """Counts a prompt's tokens as the server does, and builds text of an exact count."""

    def __init__(self, name: str, tokenizer: Tokenizer, *, add_special_tokens: bool) -> None:
        self.name = name
        self.add_special_tokens = add_special_tokens
        self._tokenizer = tokenizer
        self.special = self.count("")  # what the server adds to any text (a BOS)
        self._padding = self._ids(_PADDING)

    def _ids(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _text(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=self.add_special_tokens).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        """count() of each text, encoded as one batch (the tokenizers library spreads a batch over its threads)."""
        encoded = self._tokenizer.encode_batch(texts, add_special_tokens=self.add_special_tokens)
        return [len(e.ids) for e in encoded]

    def fit(self, tokens: int, build: Callable[[int], str]) -> str:
        """Text of exactly `tokens` tokens. `build(words)` is the category's seeded text of that many words (the
        same text for the same words): the most words whose text fits is chosen, then the last tokens are cut or
        padding tokens appended to the exact count."""
        content = tokens - self.special
        if content < 0:
            raise ValueError(
                f"prompt_tokens {tokens} is less than the {self.special} special token(s) {self.name} adds"
            )
        if content == 0:
            return ""
        words = content
        text = build(words)
        got = self.count(text) - self.special
        # Every word is at least one token, so fewer words always come closer; the ratio gets there in a step or
        # two (real text runs 1.2-1.5 tokens a word).
        while got > content and words > 1:
            words = max(1, min(words - 1, words * content // got))
            text = build(words)
            got = self.count(text) - self.special
        # A step down can overshoot (a category's fixed question is dense in tokens): a few steps back up keep the
        # padding to the last few tokens.
        for _ in range(3):
            if got >= content:
                break
            more = words + max(1, (content - got) * words // max(got, 1))
            longer = build(more)
            longer_got = self.count(longer) - self.special
            if longer_got > content:
                break
            words, text, got = more, longer, longer_got
        exact = self._cut(self._ids(text), tokens)
        if exact is None:
            # No cut of the category's text counts exactly (its first word is several tokens, all or none of which
            # survive a decode and encode): the padding alone, whose words are single tokens.
            exact = self._cut([], tokens)
        if exact is None:
            raise ValueError(f"no text of exactly {tokens} tokens under {self.name}: its decode and encode disagree")
        return exact

    def _cut(self, ids: list[int], tokens: int) -> str | None:
        content = tokens - self.special
        while len(ids) < content + _CUT_SEARCH:
            ids = ids + self._padding
        for offset in sorted(range(-_CUT_SEARCH, _CUT_SEARCH + 1), key=lambda o: (abs(o), o)):
            cut = content + offset
            if cut <= 0:
                continue
            candidate = self._text(ids[:cut])
            if self.count(candidate) == tokens:
                return candidate
        return None


@functools.lru_cache(maxsize=4)
def tokenizer_json(name: str) -> str:
    """The tokenizer at `name` (a local path, or a Hugging Face id in the local cache), never downloaded, as its
    fast tokenizer's tokenizer.json: what transformers' encode and decode run, special-token rules included."""
    try:
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(name, local_files_only=True)
    except ImportError as exc:
        raise TokenizerUnavailable(f"tokenizer {name}: transformers is not installed ({exc})") from None
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerUnavailable(
            f"tokenizer {name}: not loadable from local files ({first}); give a local path, or an id already in "
            "the Hugging Face cache"
        ) from None
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerUnavailable(f"tokenizer {name}: has no fast (tokenizers) form to count prompt tokens with")
    return str(backend.to_str())


@functools.lru_cache(maxsize=8)
def prompt_tokenizer(serialized: str, *, name: str, add_special_tokens: bool) -> PromptTokenizer:
    from tokenizers import Tokenizer

    return PromptTokenizer(name, Tokenizer.from_str(serialized), add_special_tokens=add_special_tokens)


def local_prompt_tokenizer(name: str, *, add_special_tokens: bool) -> PromptTokenizer:
    return prompt_tokenizer(tokenizer_json(name), name=name, add_special_tokens=add_special_tokens)
