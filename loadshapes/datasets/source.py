"""A data set as a source of requests, in the order `vllm bench serve` sends them for the same seed.

vLLM's classes shuffle the kept rows with Python's `random` seeded with `--seed` and walk them in that order
(ShareGPT skipping pairs outside `is_valid_sequence`), then, when more requests are asked than rows remain, append
`random.choice` draws after seeding again. Request k of a source here is the k-th request of that sequence, so
the same file, count and seed give the same prompts and output lengths in both tools. The permutation is of row
offsets, not rows: a 2 GB file costs 8 bytes a row.

One difference, where a source has a `max_model_len` (the engine's, filled in by the campaign): a row whose prompt +
output tokens exceed it is skipped as ShareGPT's out-of-limit pairs are, so request k is the k-th row that fits.
vLLM's bench filters no data set by max_model_len (the server refuses such a request); without a max_model_len the
requests are vLLM's.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from loadshapes.campaign_files import anchored
from loadshapes.datasets.formats import FORMATS, DatasetFormat, detect
from loadshapes.datasets.hub import hub_format, is_hub_name, local_path
from loadshapes.datasets.index import Index, index
from loadshapes.datasets.reading import DatasetError
from loadshapes.datasets.records import Record

if TYPE_CHECKING:
    from loadshapes.tokens import PromptTokenizer

# vLLM's is_valid_sequence defaults (ShareGPT only): both at least 4 tokens, the prompt at most 1024, both 2048.
MIN_TOKENS, MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS = 4, 1024, 2048


class DatasetSource(BaseModel):
    """A data set file in one of the formats `vllm bench serve` reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dataset: str = Field(
        description="the file (a SPEED-Bench directory), read from the campaign file's directory where relative; or "
        "a Hugging Face Hub data set: hf:OWNER/NAME/FILE (a file of its repository) or hf:OWNER/NAME (by name, as "
        "vLLM's `--dataset-name hf`; needs the datasets package)"
    )
    format: DatasetFormat | None = Field(
        default=None, description="detected from the file where left out (mt_bench: named only)"
    )
    categories: tuple[str, ...] | None = Field(
        default=None, min_length=1, description="only rows of these categories (Spec-Bench, SPEED-Bench, MT-Bench)"
    )
    subset: str = Field(default="qualitative", description="SPEED-Bench: the subset file `{subset}.jsonl`")
    category: str | None = Field(
        default=None, description="the category requests carry; default: the row's own, else the format's name"
    )
    output_tokens: int | None = Field(
        default=None, ge=1, description="every request's output length (vLLM's --*-output-len); default: the row's"
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="rows whose prompt + output tokens exceed it are skipped, counted and said; default: the "
        "engine's max_model_len where the campaign has one",
    )

    @field_validator("dataset", mode="after")
    @classmethod
    def _relative_to_the_campaign(cls, v: str, info: ValidationInfo) -> str:
        return v if is_hub_name(v) else anchored(v, info)

    @property
    def path(self) -> str:
        """The file read: `dataset`, or a Hub data set's copy on this machine (loadshapes/datasets/hub.py)."""
        return local_path(self.dataset) if is_hub_name(self.dataset) else self.dataset

    @property
    def resolved_format(self) -> DatasetFormat:
        if self.format is not None:
            return self.format
        named = hub_format(self.dataset) if is_hub_name(self.dataset) else None
        return named if named is not None else detect(self.path)

    def index(self) -> Index:
        """The rows it may send (read once per file version; one line naming the file where it cannot be used)."""
        return index(self.path, self.resolved_format, self.categories, self.subset)

    def label(self, record: Record) -> str:
        if self.category is not None:
            return self.category
        return record.category if record.category else self.resolved_format


Drop = Literal["vllm_limits", "max_model_len"]


def output_length(source: DatasetSource, record: Record, count: Callable[[str], int]) -> int:
    """The output length request `record` asks: the source's `output_tokens`, else the row's (a ShareGPT reply's
    tokens, a logged body's max_tokens), else the format's default (vLLM's)."""
    if source.output_tokens is not None:
        return source.output_tokens
    if record.reply is not None:
        return count(record.reply)
    given = record.output_tokens or FORMATS[source.resolved_format].default_output_tokens
    assert given is not None, f"{source.resolved_format} rows carry their output length"
    return given


def judge(source: DatasetSource, record: Record, count: Callable[[str], int]) -> tuple[tuple[int, int], Drop | None]:
    """(prompt tokens, output tokens) of a row, and why it is skipped (None: it is sent). ShareGPT's rows first meet
    vLLM's is_valid_sequence, as vLLM prunes them; then any row meets the source's max_model_len."""
    prompt = count(record.prompt)
    output = output_length(source, record, count)
    if record.reply is not None:
        valid = (
            prompt >= MIN_TOKENS
            and (source.output_tokens is not None or output >= MIN_TOKENS)
            and prompt <= MAX_PROMPT_TOKENS
            and prompt + output <= MAX_TOTAL_TOKENS
        )
        if not valid:
            return (prompt, output), "vllm_limits"
    else:
        prompt = max(1, prompt)
    if source.max_model_len is not None and prompt + output > source.max_model_len:
        return (prompt, output), "max_model_len"
    return (prompt, output), None


class Deck:
    """Requests 0, 1, 2, ... of a source for one seed and one way of counting tokens, built as far as asked."""

    def __init__(self, source: DatasetSource, seed: int, tokenizer: PromptTokenizer | None) -> None:
        self.source = source
        self.rows = source.index()
        self.fmt = self.rows.fmt
        self.tokenizer = tokenizer
        self.order = list(range(len(self.rows)))
        random.Random(seed).shuffle(self.order)  # random.seed(seed); random.shuffle(data), on positions
        self.seed = seed
        self.walked = 0  # how far along `order` the kept requests are built
        self.kept: list[tuple[Record, int, int]] = []  # (record, prompt tokens, output tokens)
        self.extra: random.Random | None = None
        self.extra_picks: list[int] = []

    def count(self, text: str) -> int:
        """Tokens of the served model's tokenizer where known, else words."""
        return self.tokenizer.count(text) if self.tokenizer is not None else len(text.split())

    def request(self, k: int) -> tuple[Record, int, int]:
        """Request k: (record, prompt tokens, output tokens)."""
        while len(self.kept) <= k and self.walked < len(self.order):
            record = self.rows.record(self.order[self.walked])
            self.walked += 1
            lengths, why = judge(self.source, record, self.count)
            if why is None:
                self.kept.append((record, *lengths))
        if k < len(self.kept):
            return self.kept[k]
        if not self.kept:
            raise DatasetError(
                f"{self.rows.path}: no {self.fmt} row is within "
                + (f"max_model_len {self.source.max_model_len} or " if self.source.max_model_len is not None else "")
                + f"vLLM's limits (prompt {MIN_TOKENS}-{MAX_PROMPT_TOKENS} tokens, prompt + output at most "
                f"{MAX_TOTAL_TOKENS})"
            )
        # vLLM's maybe_oversample_requests: random.seed(seed), then random.choice over the kept requests.
        if self.extra is None:
            self.extra = random.Random(self.seed)
        while len(self.extra_picks) <= k - len(self.kept):
            self.extra_picks.append(self.extra.randrange(len(self.kept)))
        return self.kept[self.extra_picks[k - len(self.kept)]]
