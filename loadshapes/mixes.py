"""Request mixes: what a request looks like (workload category, prompt and output lengths), seeded."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from loadshapes.campaign_files import anchored, reads_files
from loadshapes.datasets.formats import DatasetFormat, detect
from loadshapes.datasets.hub import is_hub_name
from loadshapes.datasets.sampling import SOURCE_KEYS, DatasetEntry, dataset_requests
from loadshapes.prompts import PROMPT_BUILDERS, PrefixBlocks, prefixed_prompt

if TYPE_CHECKING:
    from loadshapes.tokens import PromptTokenizer


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Fixed(_Strict):
    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, description="tokens")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


class Uniform(_Strict):
    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, description="tokens")
    high: int = Field(ge=1, description="tokens")

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.low > self.high:
            raise ValueError(f"uniform low {self.low} is greater than high {self.high}")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)


class LogNormal(_Strict):
    """Median `median` tokens, spread `sigma` (of the log), clipped to [low, high]."""

    kind: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    low: int = Field(default=1, ge=1)
    high: int = Field(ge=1)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draws = rng.lognormal(np.log(self.median), self.sigma, size=n)
        return np.clip(np.rint(draws), self.low, self.high).astype(np.int64)


Lengths = Annotated[Fixed | Uniform | LogNormal, Field(discriminator="kind")]


class Workload(_Strict):
    """One kind of request. `output_tokens` is where the model stops (EOS); with ignore_eos it runs to max_tokens."""

    name: str = Field(description="the workload's name in reports")
    category: str = Field(
        description="the acceptance profile the simulated engine uses (chat, editing, reasoning, ...)"
    )
    prompt_tokens: Lengths = Field(
        description=(
            "prompt length distribution: the served model's tokens where its tokenizer is known, else words "
            "(docs/operator/traffic.md)"
        )
    )
    output_tokens: Lengths = Field(description="where the model stops (EOS)")
    max_tokens: int = Field(ge=1, description="sent as `max_tokens`")
    ignore_eos: bool = Field(default=False, description="sent as `ignore_eos`: run to max_tokens")

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, natural output lengths), both capped so prompt + max_tokens stays meaningful."""
        prompts = self.prompt_tokens.sample(rng, n)
        outputs = np.minimum(self.output_tokens.sample(rng, n), self.max_tokens)
        return prompts, outputs


# Shapes after public data sets: GSM8K (reasoning), ShareGPT (chat), InstructCoder (editing).
BUILTIN_WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            name="reasoning",
            category="reasoning",
            # Few-shot GSM8K prompts (~900 tokens) and ~256-token chains of thought.
            prompt_tokens=LogNormal(median=900, sigma=0.3, low=64, high=4096),
            output_tokens=LogNormal(median=256, sigma=0.3, low=16, high=1024),
            max_tokens=512,
        ),
        Workload(
            name="chat",
            category="chat",
            prompt_tokens=LogNormal(median=250, sigma=0.8, low=8, high=2048),
            output_tokens=LogNormal(median=220, sigma=0.7, low=8, high=1024),
            max_tokens=1024,
        ),
        Workload(
            name="editing",
            category="editing",
            prompt_tokens=LogNormal(median=500, sigma=0.5, low=32, high=4096),
            output_tokens=LogNormal(median=380, sigma=0.5, low=16, high=2048),
            max_tokens=2048,
        ),
    )
}


def builtin_workload(name: str) -> Workload:
    try:
        return BUILTIN_WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; built in: {', '.join(BUILTIN_WORKLOADS)}") from None


class MixEntry(_Strict):
    workload: str | Workload = Field(description="a built-in workload's name (see Workload) or an inline Workload")
    weight: float = Field(gt=0, description="relative share of requests")

    def resolved(self) -> Workload:
        return builtin_workload(self.workload) if isinstance(self.workload, str) else self.workload


class RequestSpec(BaseModel):
    """One request to send: the body's prompt and limits, and the category that travels with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    category: str
    prompt: str
    prompt_tokens: int = Field(ge=1)
    # A replayed request the trace recorded as failed: sent with max_tokens 0, which OpenAI-compatible servers
    # (vLLM, the arms' own) refuse, so its arrival is replayed and its answer is the error it expects.
    # Declared before max_tokens, whose check reads it.
    expect_error: bool = False
    max_tokens: int = Field(ge=0)
    output_tokens: int | None = Field(default=None, ge=1)  # where the (simulated) model stops
    ignore_eos: bool = False

    @field_validator("max_tokens")
    @classmethod
    def _tokens(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("expect_error"):
            if value != 0:
                raise ValueError("a request that expects an error has max_tokens 0")
        elif value < 1:
            raise ValueError("Input should be greater than or equal to 1")
        return value

    def body_hints(self) -> dict[str, int | str]:
        """The `specdrill` body extension: what a simulated engine cannot read from text."""
        hints: dict[str, int | str] = {"category": self.category, "prompt_tokens": self.prompt_tokens}
        if self.output_tokens is not None:
            hints["output_tokens"] = self.output_tokens
        return hints


@dataclass(frozen=True)
class ReplayedRequests:
    """What a replayed trace records about some requests (Replay.requests), in the order asked for."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    categories: list[str | None]  # None: the mix draws the category
    prefixes: list[PrefixBlocks] | None
    expect_error: np.ndarray


class RequestMix(_Strict):
    """Weighted workload categories, a data set file, or weighted data sets (or their categories), sampled with
    the campaign's seed."""

    entries: list[MixEntry] = Field(default_factory=list, description="weighted workloads")
    dataset: str | None = Field(
        default=None,
        description="a data set file in a format `vllm bench serve` reads (ShareGPT, Spec-Bench, SPEED-Bench, "
        "custom, MT-Bench, HumanEval, GSM8K, InstructCoder, logged OpenAI request bodies), detected, or specdrill's "
        "own JSONL (a request per line: `category`, `prompt`, `max_tokens`, ...); a relative path is read from the "
        "campaign file's directory. Or a Hugging Face Hub data set: hf:OWNER/NAME/FILE, hf:OWNER/NAME. With "
        "`format`, `categories`, ... it is one entry of `datasets`",
    )
    datasets: list[DatasetEntry] = Field(
        default_factory=list, description="weighted data sets or categories of them (docs/operator/traffic.md)"
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="a data set's rows whose prompt + output tokens exceed it are skipped, counted and said (not "
        "specdrill's own JSONL, sent as written); default: the engine's max_model_len where the campaign has one",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_dataset_with_options(cls, data: object) -> object:
        """`mix: {dataset: F, format: ..., categories: [...]}`, and a Hub data set, is a one-entry `datasets`."""
        named = isinstance(data, dict) and isinstance(data.get("dataset"), str) and is_hub_name(data["dataset"])
        if isinstance(data, dict) and "dataset" in data and (SOURCE_KEYS & set(data) or named):
            options = {k: data[k] for k in ("dataset", *SOURCE_KEYS) if k in data}
            rest = {k: v for k, v in data.items() if k not in options}
            return {**rest, "datasets": [{**options, "weight": 1}]}
        return data

    @field_validator("dataset", mode="after")
    @classmethod
    def _relative_to_the_campaign(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else anchored(v, info)

    @model_validator(mode="after")
    def _one_source(self, info: ValidationInfo) -> RequestMix:
        if sum(map(bool, (self.entries, self.dataset, self.datasets))) != 1:
            raise ValueError("a request mix has one of entries (weighted workloads), a dataset file or datasets")
        for i, entry in enumerate(self.entries):
            if isinstance(entry.workload, str) and entry.workload not in BUILTIN_WORKLOADS:
                raise ValueError(
                    f"entries.{i}: unknown workload {entry.workload!r}; built in: {', '.join(BUILTIN_WORKLOADS)}"
                )
        if not reads_files(info):
            return self
        if self.dataset is not None and self.dataset_format != "specdrill":
            # Read now, so a bad file is one line before anything is written (the rows are checked, offsets kept).
            DatasetEntry(dataset=self.dataset, weight=1).index()
        for source in self.datasets:
            source.index()
        return self

    @property
    def dataset_format(self) -> DatasetFormat | None:
        """The `dataset` file's format (None: no such file in the mix)."""
        return None if self.dataset is None else detect(self.dataset)

    @property
    def sources(self) -> list[DatasetEntry]:
        """The data sets sampled through their sources (all but specdrill's own JSONL)."""
        if self.dataset is not None and self.dataset_format != "specdrill":
            entries = [DatasetEntry(dataset=self.dataset, weight=1)]
        else:
            entries = list(self.datasets)
        if self.max_model_len is None:
            return entries
        limit = self.max_model_len
        return [e.model_copy(update={"max_model_len": min(e.max_model_len or limit, limit)}) for e in entries]

    @property
    def session_datasets(self) -> list[str]:
        """The data sets played as multi-turn sessions (loadshapes/sessions.py)."""
        return [source.dataset for source in self.sources if source.sessions is not None]

    def within(self, max_model_len: int | None) -> RequestMix:
        """The mix with each data set bounded by the engine's max_model_len (its own where lower): a longer row is
        skipped, counted and said (loadshapes/datasets/fit.py). Template text and specdrill's JSONL as they are."""
        if max_model_len is None or not (self.dataset or self.datasets):
            return self
        return self.model_copy(update={"max_model_len": min(self.max_model_len or max_model_len, max_model_len)})

    def sample(self, n: int, *, seed: int, tokenizer: PromptTokenizer | None = None) -> list[RequestSpec]:
        return self.at(range(n), seed=seed, tokenizer=tokenizer)

    def at(self, indices: Iterable[int], *, seed: int, tokenizer: PromptTokenizer | None = None) -> list[RequestSpec]:
        """Request number i of the seeded sequence, for each i: any worker can build its own share, and request i
        is the same whatever the split (every arm and every worker sees identical requests).

        With a tokenizer, `prompt_tokens` is that many of its tokens exactly (loadshapes/tokens.py); without, that
        many words."""
        if self.sources:
            return [RequestSpec.model_validate(r) for r in dataset_requests(self.sources, indices, seed, tokenizer)]
        if self.dataset is not None:
            specs = _cached_jsonl(self.dataset)
            picked = [specs[int(np.random.default_rng([seed, i]).integers(0, len(specs)))] for i in indices]
            if tokenizer is None:
                return picked
            # A dataset's prompt is the user's text: its length is counted, not made.
            return [s.model_copy(update={"prompt_tokens": max(1, tokenizer.count(s.prompt))}) for s in picked]
        workloads = [e.resolved() for e in self.entries]
        weights = np.array([e.weight for e in self.entries])
        cumulative = np.cumsum(weights / weights.sum())
        out: list[RequestSpec] = []
        for i in indices:
            rng = np.random.default_rng([seed, i])
            w = workloads[min(int(np.searchsorted(cumulative, rng.random(), side="right")), len(workloads) - 1)]
            prompts, outputs = w.sample(rng, 1)
            builder = PROMPT_BUILDERS.get(w.category, PROMPT_BUILDERS["chat"])
            out.append(
                RequestSpec(
                    category=w.category,
                    prompt=_prompt(int(prompts[0]), functools.partial(_from_copy, builder, rng), tokenizer),
                    prompt_tokens=int(prompts[0]),
                    max_tokens=w.max_tokens,
                    output_tokens=None if w.ignore_eos else int(outputs[0]),
                    ignore_eos=w.ignore_eos,
                )
            )
        return out

    def replayed(
        self,
        indices: Iterable[int],
        *,
        seed: int,
        recorded: ReplayedRequests,
        tokenizer: PromptTokenizer | None = None,
    ) -> list[RequestSpec]:
        """Requests `indices` of a replayed trace: the recorded prompt and output lengths (max_tokens with ignore_eos,
        so the engine produces that many), the recorded category or the mix's draw, the category's prompt text.

        Request i draws from the same seed as `at` does, so it is the same whoever builds it.
        """
        workloads = [e.resolved() for e in self.entries]
        weights = np.array([e.weight for e in self.entries]) if self.entries else np.ones(1)
        cumulative = np.cumsum(weights / weights.sum())
        sources = self.sources
        dataset = _cached_jsonl(self.dataset) if self.dataset is not None and not sources else None
        out: list[RequestSpec] = []
        for n, i in enumerate(indices):
            rng = np.random.default_rng([seed, i])
            category = recorded.categories[n]
            if category is None:
                if sources:
                    category = str(dataset_requests(sources, [i], seed, tokenizer)[0]["category"])
                elif dataset is not None:
                    category = dataset[int(rng.integers(0, len(dataset)))].category
                else:
                    pick = min(int(np.searchsorted(cumulative, rng.random(), side="right")), len(workloads) - 1)
                    category = workloads[pick].category
            prompt_tokens = int(recorded.prompt_tokens[n])
            if recorded.prefixes is not None:
                build = functools.partial(prefixed_prompt, recorded.prefixes[n], seed=seed)
            else:
                build = functools.partial(_from_copy, PROMPT_BUILDERS.get(category, PROMPT_BUILDERS["chat"]), rng)
            prompt = _prompt(prompt_tokens, build, tokenizer)
            failed = bool(recorded.expect_error[n])
            out.append(
                RequestSpec(
                    category=category,
                    prompt=prompt,
                    prompt_tokens=prompt_tokens,
                    max_tokens=0 if failed else int(recorded.output_tokens[n]),
                    ignore_eos=not failed,
                    expect_error=failed,
                )
            )
        return out


def _prompt(length: int, build: Callable[[int], str], tokenizer: PromptTokenizer | None) -> str:
    return build(length) if tokenizer is None else tokenizer.fit(length, build)


def _from_copy(builder: Callable[[int, np.random.Generator], str], rng: np.random.Generator, words: int) -> str:
    # Fitting to a token count builds more than once: each build starts from the request's generator as it was,
    # so a number of words always gives the same text.
    return builder(words, copy.deepcopy(rng))


@functools.lru_cache(maxsize=8)
def _cached_jsonl(path: str) -> list[RequestSpec]:
    return load_jsonl(path)


def load_jsonl(path: str) -> list[RequestSpec]:
    """A user dataset: one JSON object per line with category, prompt, max_tokens (prompt_tokens defaults to the
    prompt's word count)."""
    import json

    from pydantic import ValidationError

    specs: list[RequestSpec] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if isinstance(data, dict) and "prompt_tokens" not in data and isinstance(data.get("prompt"), str):
                    data["prompt_tokens"] = max(1, len(data["prompt"].split()))
                specs.append(RequestSpec.model_validate(data))
            except (json.JSONDecodeError, ValidationError) as exc:
                detail = str(exc).splitlines()[0] if isinstance(exc, json.JSONDecodeError) else exc.errors()[0]
                if isinstance(detail, dict):
                    detail = f"{'.'.join(str(p) for p in detail['loc'])}: {detail['msg']}"
                raise ValueError(f"{path}:{number}: {detail}") from None
    if not specs:
        raise ValueError(f"{path}: no requests in the dataset")
    return specs
