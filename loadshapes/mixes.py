"""Request mixes: what a request looks like (workload category, prompt and output lengths), seeded."""

from __future__ import annotations

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
