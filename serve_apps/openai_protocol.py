"""The OpenAI-compatible request and response shapes an arm serves (the subset load tests and peers use)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    # vLLM's extension: cumulative usage on every chunk, so a client can count the tokens each chunk carries.
    continuous_usage_stats: bool = False


class SpecdrillHints(BaseModel):
    """Vendor extension (`specdrill` in the body): what a simulated engine needs that text cannot tell it.

    Real engines ignore it. prompt_tokens overrides the whitespace token count of the prompt; output_tokens is
    where the simulated model emits EOS; category picks the acceptance profile.
    """

    model_config = ConfigDict(extra="forbid")
    category: str | None = None
    prompt_tokens: int | None = Field(default=None, ge=1)
    output_tokens: int | None = Field(default=None, ge=1)


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    seed: int | None = None
    temperature: float | None = None
    n: int = 1
    specdrill: SpecdrillHints | None = None

    @model_validator(mode="after")
    def _single_choice(self) -> _Common:
        if self.n != 1:
            raise ValueError("only n=1 is supported (vLLM reports speculative-decoding metrics for n == 1 only)")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(
            self.stream_options and self.stream_options.include_usage and self.stream_options.continuous_usage_stats
        )


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise ValueError("one prompt per request")
        return self

    def prompt_text(self) -> str | None:
        if isinstance(self.prompt, str):
            return self.prompt
        if self.prompt and isinstance(self.prompt[0], str):
            return str(self.prompt[0])
        return None

    def prompt_token_ids(self) -> list[int] | None:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], int):
            return [int(t) for t in self.prompt]
        return None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if isinstance(self.content, list):
            return " ".join(str(part.get("text", "")) for part in self.content)
        return ""


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)

    def prompt_text(self) -> str:
        return "\n".join(f"{m.role}: {m.text()}" for m in self.messages)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
