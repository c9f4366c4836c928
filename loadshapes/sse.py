"""Reading an OpenAI streaming response: token times per token, usage, and the server's telemetry.

Pure (no I/O): the load worker feeds each SSE line with the time it arrived and turns the result into a trace
row. What the server says about speculation is read where the plan's `SpeculationFields` (its engine kind's
dialect) says it is. A chunk may carry several tokens (speculative decoding accepts drafts in bursts); with vLLM's
`continuous_usage_stats` every chunk says the cumulative completion tokens, so each token gets the time of the
chunk that delivered it.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadshapes.spec_fields import LIST_COLUMNS, SpecColumn, SpeculationFields, extract
from loadshapes.trace import dumps_config, to_ns

NO_FIELDS = SpeculationFields()


def body_lines(chunks: Sequence[bytes], times: Sequence[int]) -> Iterator[tuple[bytes, int]]:
    """The lines of a response body that arrived in pieces, each with the arrival time of the piece that
    completed it (a line split across two socket reads arrived with the second). Line ends are dropped."""
    pending = b""
    for chunk, t_ns in zip(chunks, times, strict=True):
        *complete, pending = (pending + chunk if pending else chunk).split(b"\n")
        yield from ((line, t_ns) for line in complete)
    if pending:
        yield pending, times[-1]  # a last line without its line end


# Keys of the usage object; a key appears once per chunk (see _content_chunk_fast on why strings cannot match).
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":(\d+)')


class StreamError(Exception):
    """The response broke the OpenAI streaming protocol; `kind` becomes the trace row's error_class."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class StreamResult:
    token_times_ns: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    telemetry: dict[str, Any] | None = None
    speculation: SpeculationFields = NO_FIELDS  # where the server's per-request speculation figures are
    spec_values: dict[SpecColumn, Any] = field(default_factory=dict)  # what was found there
    done: bool = False  # saw `data: [DONE]`
    counted_by_usage: bool = False

    def __post_init__(self) -> None:
        # Chunks holding one of these keys take the JSON path, so their fields are read.
        self._json_keys = (b'"specdrill"', b'"error"', *self.speculation.top_keys())

    @property
    def first_token_ns(self) -> int | None:
        return self.token_times_ns[0] if self.token_times_ns else None

    def feed(self, line: bytes | str, t_ns: int) -> None:
        if isinstance(line, bytes):
            if len(line) <= 2:
                return  # the blank line between events
            if self._content_chunk_fast(line, t_ns):
                return
            line = line.decode("utf-8", "replace")
        text = line.strip()
        if not text or text.startswith(":") or not text.startswith("data:"):
            return  # blank separators, comments, event/id fields
        data = text[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            raise StreamError("invalid_json", f"undecodable SSE data: {data[:120]!r}") from None
        if not isinstance(payload, dict):
            raise StreamError("invalid_json", f"SSE data is not an object: {data[:120]!r}")
        if "error" in payload:
            error = payload["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise StreamError("server_error", stream_error_message(message))
        self._absorb(payload, t_ns)

    def _content_chunk_fast(self, line: bytes, t_ns: int) -> bool:
        """A content chunk with cumulative usage, read without decoding JSON (most lines of a stream are these).

        Safe on raw bytes: inside a JSON string a quote is always escaped, so these patterns only match keys.
        Anything else (the final chunk with telemetry, errors, chunks without usage) takes the JSON path.
        """
        if not line.startswith(b'data: {"') or b'"choices":[{' not in line:
            return False
        if any(key in line for key in self._json_keys):
            return False
        usage = _COMPLETION_TOKENS.search(line)
        if usage is None:
            return False
        completion = int(usage.group(1))
        self.counted_by_usage = True
        new_tokens = completion - len(self.token_times_ns)
        if new_tokens > 0:
            self.token_times_ns.extend([t_ns] * new_tokens)
        self.output_tokens = completion
        if self.prompt_tokens is None:
            prompt = _PROMPT_TOKENS.search(line)
            if prompt is not None:
                self.prompt_tokens = int(prompt.group(1))
        f = line.find(b'"finish_reason":"')
        if f >= 0:
            g = line.find(b'"', f + 17)
            self.finish_reason = line[f + 17 : g].decode()
        return True

    def _absorb(self, payload: dict[str, Any], t_ns: int) -> None:
        usage = payload.get("usage")
        choices = payload.get("choices") or []
        new_tokens = 0
        if isinstance(usage, dict):
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            completion = usage.get("completion_tokens")
            if isinstance(completion, int):
                if choices:  # a content chunk with continuous usage: cumulative count
                    self.counted_by_usage = True
                    new_tokens = max(0, completion - len(self.token_times_ns))
                self.output_tokens = completion
        if choices:
            choice = choices[0]
            if not self.counted_by_usage and _has_text(choice):
                new_tokens = 1  # without usage per chunk, one token per non-empty delta is all we can know
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if new_tokens:
            self.token_times_ns.extend([t_ns] * new_tokens)
        if "specdrill" in payload:
            self.telemetry = payload["specdrill"]
        if self.speculation.fields:
            self.spec_values.update(extract(payload, self.speculation.fields))

    def check_complete(self) -> None:
        if not self.done:
            raise StreamError("truncated_stream", "the stream ended before data: [DONE]")
        if self.output_tokens is None:
            raise StreamError("missing_usage", "the stream carried no usage (stream_options.include_usage)")


def _has_text(choice: dict[str, Any]) -> bool:
    if "delta" in choice:
        return bool((choice.get("delta") or {}).get("content"))
    return bool(choice.get("text"))


def answer_text(lines: Iterable[bytes]) -> str:
    """The text an answer streamed (the first choice's chat `delta.content` or completion `text`, in order): what a
    session's next turn carries as the assistant's turn. Decoded only for a session turn with a turn after it (the
    row itself needs no text)."""
    parts: list[str] = []
    for line in lines:
        data = line.strip()
        if not data.startswith(b"data:") or data[5:].strip() in (b"", b"[DONE]"):
            continue
        try:
            payload = json.loads(data[5:])
        except json.JSONDecodeError:
            continue  # the row says what broke; the text is what could be read
        choices = payload.get("choices") if isinstance(payload, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str):
                parts.append(piece)
    return "".join(parts)


def stream_error_message(message: object) -> str:
    """A server's error event, as a row's error_message (the virtual runner writes the same words)."""
    return f"error event in stream: {message}"


def cancelled_message(waited_s: float) -> str:
    """A request the worker cancelled at its stop, as a row's error_message (the virtual runner's too)."""
    return f"still in flight {waited_s:.1f} s after its scheduled send when the worker stopped"


def latency_columns(scheduled_ns: int, result: StreamResult, done_ns: int | None) -> dict[str, Any]:
    """TTFT and end-to-end count from the SCHEDULED send time; per-token latency from the token times."""
    times = result.token_times_ns
    columns: dict[str, Any] = {
        "first_token_ns": times[0] if times else None,
        "ttft_s": (times[0] - scheduled_ns) / 1e9 if times else None,
        "e2e_s": (done_ns - scheduled_ns) / 1e9 if done_ns is not None else None,
        "tpot_s": None,
        "itl_p50_s": None,
        "itl_p99_s": None,
        "itl_max_s": None,
    }
    if len(times) > 1:
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        columns.update(
            tpot_s=(times[-1] - times[0]) / 1e9 / (len(times) - 1),
            itl_p50_s=_quantile(gaps, 0.5) / 1e9,
            itl_p99_s=_quantile(gaps, 0.99) / 1e9,
            itl_max_s=gaps[-1] / 1e9,
        )
    return columns


def _quantile(ordered: list[int], q: float) -> float:
    """numpy's default (linear) quantile of a sorted list, without numpy's per-call overhead (once per request)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def telemetry_columns(result: StreamResult) -> dict[str, Any]:
    """The server's `specdrill` object and its per-request speculation figures, flattened into trace columns (the
    totals a dialect reports without per-step lists are in result.spec_values: see spec_totals)."""
    tel = result.telemetry or {}
    stamps = tel.get("timestamps") or {}
    executed = tel.get("executed") or {}
    spec = result.spec_values
    return {
        "queue_wait_s": tel.get("queue_wait_s"),
        "server_received_ns": to_ns(stamps.get("received")),
        "server_first_scheduled_ns": to_ns(stamps.get("first_scheduled")),
        "server_first_token_ns": to_ns(stamps.get("first_token")),
        "server_done_ns": to_ns(stamps.get("done")),
        "step_batch_size": executed.get("step_batch_size"),
        "step_k": executed.get("step_k"),
        **{column: spec.get(column) for column in LIST_COLUMNS},
        "resolved_speculative_config": dumps_config(tel.get("resolved_speculative_config")) if tel else None,
        "schedule_dropped": tel.get("schedule_dropped"),
        "replica_id": tel.get("replica_id"),
        "engine_id": tel.get("engine_id"),
        "node_id": tel.get("node_id"),
    }


def spec_totals(result: StreamResult) -> dict[str, Any]:
    """The per-request totals the server reported itself (a dialect without per-step lists): they replace the
    ones summed from lists (loadshapes.trace.step_summaries)."""
    return {c: v for c, v in result.spec_values.items() if c not in LIST_COLUMNS}
