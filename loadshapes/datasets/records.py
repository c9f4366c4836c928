"""One record of each data set format `vllm bench serve` reads, as pydantic models, and what specdrill sends for it.

Each model keeps only the fields vLLM's dataset class reads (vllm/benchmarks/datasets/datasets.py; file:line in
docs/engineering/datasets.md) and ignores the rest, as vLLM does. `Record` is the request a row becomes: the prompt
vLLM sends, the output length vLLM expects (the reply's text to count for ShareGPT, a number where the file has
one, else vLLM's default for the format) and the row's category where the format has one.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class _Row(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


@dataclass(frozen=True)
class Record:
    prompt: str
    category: str | None = None
    output_tokens: int | None = None  # the length vLLM expects, where the row has it
    reply: str | None = None  # ShareGPT: the reply whose token count is the output length
    # The conversation's later user turns, each with the data set's reply where it has one (its length is that
    # turn's output length): played only by a data set entry with `sessions` (loadshapes/sessions.py).
    later: tuple[tuple[str, str | None], ...] = ()


class SpecdrillRow(_Row):
    """specdrill's own JSONL as one of weighted `datasets` (alone, `mix: {dataset: F}` reads it as it always has):
    `output_tokens` where the model stops, else `max_tokens`."""

    category: str
    prompt: str
    max_tokens: int = Field(ge=1)
    output_tokens: int | None = Field(default=None, ge=1)

    def record(self) -> Record:
        return Record(prompt=self.prompt, category=self.category, output_tokens=self.output_tokens or self.max_tokens)


class ShareGPTTurn(_Row):
    speaker: str = Field(alias="from")
    value: str


class ShareGPTEntry(_Row):
    """ShareGPTDataset: entries with two or more turns; the first turn is the prompt and the second's length the
    output length, whoever speaks them (vLLM does not look at `from`)."""

    conversations: list[ShareGPTTurn] = Field(default_factory=list)

    def record(self) -> Record:
        # Later turns by position, as vLLM reads the first pair: user turns at even places, replies at odd ones.
        turns = [t.value for t in self.conversations]
        later = tuple((turns[i], turns[i + 1] if i + 1 < len(turns) else None) for i in range(2, len(turns), 2))
        return Record(prompt=turns[0], reply=turns[1], later=later)


class SpecBenchQuestion(_Row):
    """Spec-Bench's question.jsonl (SpecBench): turns[0] is the prompt, `category` filters."""

    question_id: int | str | None = None
    category: str
    turns: list[str] = Field(min_length=1)

    def record(self) -> Record:
        return Record(prompt=self.turns[0], category=self.category, later=tuple((t, None) for t in self.turns[1:]))


class Message(_Row):
    role: str
    content: str


class SpeedBenchRow(_Row):
    """A SPEED-Bench subset's row (SpeedBench): messages[0].content is the prompt."""

    messages: list[Message] = Field(min_length=1)
    category: str | None = None

    def record(self) -> Record:
        return Record(prompt=self.messages[0].content, category=self.category)


class CustomRow(_Row):
    """vLLM's `custom` JSONL (CustomDataset): `prompt`, optional `output_tokens`."""

    prompt: str
    output_tokens: int | None = Field(default=None, ge=1)

    def record(self) -> Record:
        return Record(prompt=self.prompt, output_tokens=self.output_tokens)


class MTBenchRow(_Row):
    """philschmid/mt-bench (MTBenchDataset): turns[0] (vLLM sends only it; the second turn is played by
    `sessions`)."""

    category: str | None = None
    turns: list[str] = Field(min_length=1)

    def record(self) -> Record:
        return Record(prompt=self.turns[0], category=self.category, later=tuple((t, None) for t in self.turns[1:]))


class HumanEvalRow(_Row):
    """openai/openai_humaneval (HumanEvalDataset): `prompt` (a function signature and docstring)."""

    task_id: str
    prompt: str

    def record(self) -> Record:
        return Record(prompt=self.prompt)


class GSM8KRow(_Row):
    """openai/gsm8k (GSM8KDataset): `question`."""

    question: str
    answer: str

    def record(self) -> Record:
        return Record(prompt=self.question)


class InstructCoderRow(_Row):
    """likaixin/InstructCoder (InstructCoderDataset): the prompt vLLM builds from `input` and `instruction`."""

    instruction: str
    input: str

    def record(self) -> Record:
        return Record(
            prompt=f"{self.input}\n\n{self.instruction} Just output the code, do not include any explanation."
        )


class ChatBody(_Row):
    """A logged OpenAI chat-completions request body: the last user message is the prompt (earlier turns are
    history, not replayed as such), `max_completion_tokens` or `max_tokens` the output length."""

    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def record(self) -> Record:
        users = [m.content for m in self.messages if m.role == "user"]
        return Record(
            prompt=users[-1] if users else self.messages[-1].content,
            output_tokens=self.max_completion_tokens or self.max_tokens,
        )


class CompletionBody(_Row):
    """A logged OpenAI completions request body: `prompt` (one string) and `max_tokens`."""

    model: str | None = None
    prompt: str
    max_tokens: int = Field(ge=1)

    def record(self) -> Record:
        return Record(prompt=self.prompt, output_tokens=self.max_tokens)
