"""A campaign's data sets under its engine: each one's line (rows sent, rows skipped and why, whose tokens counted
them, where the output lengths come from), or one line refusing a data set that would send nothing. Counted where
the run starts, before anything is written, in the served model's tokens (the tokenizer the load workers get),
else in words."""

from __future__ import annotations

from loadshapes.datasets.fit import fits
from loadshapes.datasets.reading import DatasetError
from loadshapes.mixes import RequestMix
from loadshapes.tokens import PromptTokenizer, TokenizerUnavailable, local_prompt_tokenizer
from serve_apps.arms import EngineConfig, prompt_tokenizer_name
from serve_apps.engine_kinds.registry import kind_of


class DatasetRefused(ValueError):
    """One line: a data set the run cannot send (every row too long)."""


def _tokenizer(engine: EngineConfig, endpoint: str) -> tuple[PromptTokenizer | None, str]:
    """The served model's tokenizer, or None and why the counts are words. One that cannot be loaded here counts
    words (a real run refuses it before it deploys: execute.ray_executor.check_tokenizer)."""
    name = prompt_tokenizer_name(engine)
    if name is None:
        return None, "no tokenizer known"
    try:
        # As the load workers count: a completion's prompt with the special tokens the server adds.
        return local_prompt_tokenizer(name, add_special_tokens=endpoint == "completions"), ""
    except TokenizerUnavailable:
        return None, f"{kind_of(engine).tokenizer_field(engine)} {name} is not loadable here"


def dataset_lines(mix: RequestMix, engine: EngineConfig, endpoint: str) -> list[str]:
    """One line per data set of the mix (none for template text or specdrill's JSONL); DatasetRefused where one
    sends no row."""
    sources = mix.sources
    if not sources:
        return []
    try:
        tokenizer, words_because = _tokenizer(engine, endpoint)
        return [fit.line() for fit in fits(sources, tokenizer, words_because=words_because)]
    except DatasetError as exc:
        raise DatasetRefused(str(exc)) from None
