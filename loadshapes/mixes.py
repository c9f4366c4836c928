"""Request mixes: what a request looks like (workload category, prompt and output lengths), seeded."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Fixed(_Strict):
    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


class Uniform(_Strict):
    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1)
    high: int = Field(ge=1)

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

    name: str
    category: str
    prompt_tokens: Lengths
    output_tokens: Lengths
    max_tokens: int = Field(ge=1)
    ignore_eos: bool = False

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
    workload: str | Workload
    weight: float = Field(gt=0)

    def resolved(self) -> Workload:
        return builtin_workload(self.workload) if isinstance(self.workload, str) else self.workload


class RequestSpec(BaseModel):
    """One request to send: the body's prompt and limits, and the category that travels with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    category: str
    prompt: str
    prompt_tokens: int = Field(ge=1)
    max_tokens: int = Field(ge=1)
    output_tokens: int | None = Field(default=None, ge=1)  # where the (simulated) model stops
    ignore_eos: bool = False

    def body_hints(self) -> dict[str, int | str]:
        """The `specdrill` body extension: what a simulated engine cannot read from text."""
        hints: dict[str, int | str] = {"category": self.category, "prompt_tokens": self.prompt_tokens}
        if self.output_tokens is not None:
            hints["output_tokens"] = self.output_tokens
        return hints


class RequestMix(_Strict):
    """Weighted workload categories, or a user's JSONL dataset (one RequestSpec per line), sampled with a seed."""

    entries: list[MixEntry] = Field(default_factory=list)
    dataset: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> RequestMix:
        if bool(self.entries) == bool(self.dataset):
            raise ValueError("a request mix has either entries (weighted workloads) or a dataset file, not both")
        for i, entry in enumerate(self.entries):
            if isinstance(entry.workload, str) and entry.workload not in BUILTIN_WORKLOADS:
                raise ValueError(
                    f"entries.{i}: unknown workload {entry.workload!r}; built in: {', '.join(BUILTIN_WORKLOADS)}"
                )
        return self

    def sample(self, n: int, *, seed: int) -> list[RequestSpec]:
        return self.at(range(n), seed=seed)

    def at(self, indices: Iterable[int], *, seed: int) -> list[RequestSpec]:
        """Request number i of the seeded sequence, for each i: any worker can build its own share, and request i
        is the same whatever the split (every arm and every worker sees identical requests)."""
        from loadshapes.prompts import PROMPT_BUILDERS

        if self.dataset is not None:
            specs = _cached_jsonl(self.dataset)
            return [specs[int(np.random.default_rng([seed, i]).integers(0, len(specs)))] for i in indices]
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
                    prompt=builder(int(prompts[0]), rng),
                    prompt_tokens=int(prompts[0]),
                    max_tokens=w.max_tokens,
                    output_tokens=None if w.ignore_eos else int(outputs[0]),
                    ignore_eos=w.ignore_eos,
                )
            )
        return out


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
