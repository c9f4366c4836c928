"""What a data set sends of its file: every kept row's prompt and output lengths counted once, in the served model's
tokens where a tokenizer is known (else words, said to be estimates), against vLLM's ShareGPT limits and the
source's max_model_len. The counts are over the whole file, not a seed's walk: the same line for every shape and
repeat, and a file none of whose rows fits is refused before anything runs.

One pass over the file (rows decoded in file order, tokenized in batches), cached per file version, source and
tokenizer: `run` and `simulate` ask before they write, the run's manifest keeps the lines.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loadshapes.datasets.formats import FORMATS
from loadshapes.datasets.reading import DatasetError
from loadshapes.datasets.records import Record
from loadshapes.datasets.source import MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS, MIN_TOKENS, DatasetSource, judge

if TYPE_CHECKING:
    from loadshapes.tokens import PromptTokenizer

DATASET_MARK = "data set "  # how a Fit's line starts (the report prints it before the answer)
BATCH = 512  # rows tokenized at once (the tokenizer's batch encode runs them on its own threads)


@dataclass
class Fit:
    """One source's rows under its limits."""

    path: str
    source: DatasetSource
    counted_by: str | None  # the tokenizer's name; None: words
    words_because: str = "no tokenizer known"
    rows: int = 0  # rows the index keeps (vLLM's filters before its shuffle applied)
    sent: int = 0
    vllm_limits: int = 0  # ShareGPT pairs outside is_valid_sequence
    too_long: int = 0  # prompt + output over max_model_len
    shortest_too_long: int | None = None
    longest: int = 0  # prompt + output of the longest row within vLLM's limits
    own_output: int = 0  # rows whose output length is the file's (a reply, a logged max_tokens)
    drops: list[str] = field(default_factory=list)

    @property
    def unit(self) -> str:
        return "tokens" if self.counted_by is not None else "words"

    def counted(self) -> str:
        if self.counted_by is not None:
            return f"counted in {self.counted_by}'s tokens"
        return f"counted in words: {self.words_because}, so the lengths are estimates"

    def outputs(self) -> str:
        """Where the output lengths come from, in the line's words."""
        fmt = self.source.resolved_format
        if self.source.output_tokens is not None:
            return f"output lengths: {self.source.output_tokens} tokens each (output_tokens)"
        if fmt == "sharegpt":
            return "output lengths from the data set (each reply's length)"
        default = FORMATS[fmt].default_output_tokens
        if self.own_output == self.sent:
            return "output lengths from the data set"
        if self.own_output == 0:
            return f"output lengths not in the data set: {default} tokens each ({fmt}'s default, vLLM's)"
        return (
            f"output lengths from the data set for {self.own_output:,} rows, {default} tokens ({fmt}'s default) for "
            f"{self.sent - self.own_output:,}"
        )

    def line(self) -> str:
        """The operator's line: how many rows are sent, how many skipped and why, whose tokens counted them."""
        limit = self.source.max_model_len
        skipped = []
        if self.vllm_limits:
            skipped.append(f"{self.vllm_limits:,} outside vLLM's ShareGPT limits")
        if limit is not None:
            skipped.append(f"{self.too_long:,} over max_model_len {limit:,} (prompt + output)")
        else:
            skipped.append("none checked against max_model_len (none known)")
        return (
            f"{DATASET_MARK}{self.path} ({self.source.resolved_format}): {self.sent:,} of {self.rows:,} rows sent, "
            f"{', '.join(skipped)}; {self.counted()}; {self.outputs()}"
        )

    def refusal(self) -> str | None:
        """One line where no row is sent, else None."""
        if self.sent:
            return None
        limit = self.source.max_model_len
        if self.too_long and limit is not None:
            more = f"; {self.vllm_limits:,} more are outside vLLM's ShareGPT limits" if self.vllm_limits else ""
            return (
                f"{self.path}: all {self.too_long:,} {self.source.resolved_format} rows are longer than max_model_len "
                f"{limit:,}: prompt + output {self.shortest_too_long:,} to {self.longest:,} {self.unit}, "
                f"{self.counted()}{more}; raise the engine's max_model_len or send shorter rows"
            )
        return (
            f"{self.path}: no {self.source.resolved_format} row is within vLLM's limits (prompt {MIN_TOKENS}-"
            f"{MAX_PROMPT_TOKENS} tokens, prompt + output at most {MAX_TOTAL_TOKENS}; {self.counted()})"
        )


def _batches(records: Iterator[Record]) -> Iterator[list[Record]]:
    batch: list[Record] = []
    for record in records:
        batch.append(record)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _counts(texts: list[str], tokenizer: PromptTokenizer | None) -> dict[str, int]:
    if tokenizer is None:
        return {t: len(t.split()) for t in texts}
    return dict(zip(texts, tokenizer.count_many(texts), strict=True))


def measure(source: DatasetSource, tokenizer: PromptTokenizer | None) -> Fit:
    """Every kept row of `source` judged as a request (source.judge), in one pass over its file."""
    rows = source.index()
    fit = Fit(path=rows.path, source=source, counted_by=None if tokenizer is None else tokenizer.name)
    for batch in _batches(rows.records()):
        texts = [t for r in batch for t in (r.prompt, r.reply) if t is not None]
        counts = _counts(texts, tokenizer)
        for record in batch:
            (prompt, output), why = judge(source, record, counts.__getitem__)
            fit.rows += 1
            if why == "vllm_limits":
                fit.vllm_limits += 1
                continue
            fit.longest = max(fit.longest, prompt + output)
            if why == "max_model_len":
                fit.too_long += 1
                length = prompt + output
                fit.shortest_too_long = length if fit.shortest_too_long is None else min(fit.shortest_too_long, length)
                continue
            fit.sent += 1
            fit.own_output += record.reply is not None or record.output_tokens is not None
    return fit


_LOCK = threading.Lock()
_FITS: dict[tuple[object, ...], Fit] = {}


def fits(
    sources: Sequence[DatasetSource], tokenizer: PromptTokenizer | None, *, words_because: str = "no tokenizer known"
) -> list[Fit]:
    """Each source's Fit (kept per file version, source and tokenizer); one line (DatasetError) for the first
    source that sends no row. Without a tokenizer, `words_because` says why the counts are words."""
    out = []
    tokens = None if tokenizer is None else (tokenizer.name, tokenizer.add_special_tokens)
    for source in sources:
        stat = os.stat(source.index().path)
        key = (source, stat.st_mtime_ns, stat.st_size, tokens, words_because)
        with _LOCK:
            found = _FITS.get(key)
        if found is None:
            found = measure(source, tokenizer)
            found.words_because = words_because
            with _LOCK:
                if len(_FITS) > 32:
                    _FITS.clear()
                _FITS[key] = found
        problem = found.refusal()
        if problem is not None:
            raise DatasetError(problem)
        out.append(found)
    return out
