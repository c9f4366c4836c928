"""An arm's OpenAI-compatible service: requests in, engine events out, telemetry of what ran on every response.

Framework-free on purpose: the Ray Serve deployment (deployment.py) only routes HTTP here.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from serve_apps.arms import ArmSpec
from serve_apps.engines.base import Engine, EngineDead, GenerationInput, GenerationResult, TextDelta, engine_facts
from serve_apps.openai_protocol import ChatCompletionRequest, CompletionRequest, usage
from serve_apps.policy_kinds import engine_config

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


class RequestError(ValueError):
    """A client error: becomes HTTP 400 with OpenAI's error shape."""


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    inp: GenerationInput
    stream: bool
    include_usage: bool
    continuous_usage: bool


@dataclass(frozen=True, slots=True)
class Placement:
    replica_id: str
    node_id: str
    node_ip: str


def error_body(message: str, *, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": 400}}


def engine_dead_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "engine_dead", "param": None, "code": 503}}


class ArmService:
    def __init__(self, arm: ArmSpec, engine: Engine, placement: Placement, versions: dict[str, str]) -> None:
        self.arm = arm
        self.engine = engine
        self.placement = placement
        self.versions = {**versions, **engine.versions()}
        self.configured = engine_config(arm.policy)

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.arm.served_model_name, "object": "model", "created": 0, "owned_by": "specdrill"}],
        }

    def info(self) -> dict[str, Any]:
        resolved = self.engine.resolved_speculative_config()
        return {
            "arm": self.arm.name,
            "engine_kind": self.engine.kind,
            "engine_id": self.engine.engine_id,
            "configured_policy": self.arm.policy.model_dump(mode="json"),
            "configured_speculative_config": self.configured,
            "resolved_speculative_config": resolved,
            "schedule_dropped": schedule_dropped(self.configured, resolved),
            # cudagraph_mode, data_parallel_size, engine_ids (rank -> engine id), schedule_dropped_reason
            **engine_facts(self.engine),
            "topology": self.arm.topology.model_dump(mode="json"),
            "replica_id": self.placement.replica_id,
            "node_id": self.placement.node_id,
            "node_ip": self.placement.node_ip,
            "versions": self.versions,
        }

    def parse(self, body: Any, *, chat: bool, request_id: str | None) -> ParsedRequest:
        """Validate a request body into what the engine and the response writer need."""
        try:
            req: CompletionRequest | ChatCompletionRequest = (
                ChatCompletionRequest.model_validate(body) if chat else CompletionRequest.model_validate(body)
            )
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "body"
            raise RequestError(f"{where}: {err['msg']}") from None
        if req.model is not None and req.model != self.arm.served_model_name:
            raise RequestError(
                f"model {req.model!r} is not served here; this arm serves {self.arm.served_model_name!r}"
            )
        rid = request_id or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        hints = req.specdrill
        text = req.prompt_text()
        ids = None if isinstance(req, ChatCompletionRequest) else req.prompt_token_ids()
        inp = GenerationInput(
            request_id=rid,
            prompt_text=text,
            prompt_token_ids=ids,
            max_tokens=req.token_limit or DEFAULT_MAX_TOKENS,
            ignore_eos=req.ignore_eos,
            seed=req.seed,
            temperature=1.0 if req.temperature is None else req.temperature,
            category=(hints.category if hints and hints.category else "chat"),
            prompt_tokens_hint=hints.prompt_tokens if hints else None,
            output_tokens_hint=hints.output_tokens if hints else None,
        )
        return ParsedRequest(inp, req.stream, req.include_usage, req.continuous_usage)

    def telemetry(self, result: GenerationResult, *, request_id: str, received: float) -> dict[str, Any]:
        return {
            **self.info(),
            "request_id": request_id,
            "engine_id": result.engine_id or self.engine.engine_id,
            "dp_rank": result.dp_rank,
            "executed": {"step_batch_size": result.step_batch_sizes, "step_k": result.step_k},
            "queue_wait_s": result.queue_wait,
            "timestamps": {
                "received": received,
                "first_scheduled": result.first_scheduled,
                "first_token": result.first_token,
                "done": result.finished,
            },
        }

    async def complete(self, inp: GenerationInput, *, chat: bool, received: float) -> dict[str, Any]:
        text: list[str] = []
        result: GenerationResult | None = None
        async for event in self.engine.generate(inp):
            if isinstance(event, TextDelta):
                text.append(event.text)
            else:
                result = event
        assert result is not None
        choice: dict[str, Any]
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(text)},
                "finish_reason": result.finish_reason,
            }
        else:
            choice = {"index": 0, "text": "".join(text), "logprobs": None, "finish_reason": result.finish_reason}
        return {
            "id": inp.request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.arm.served_model_name,
            "choices": [choice],
            "usage": usage(result.prompt_tokens, result.completion_tokens),
            "metrics": {"speculative_decoding": result.spec_decode_metrics},
            "specdrill": self.telemetry(result, request_id=inp.request_id, received=received),
        }

    async def stream(
        self, inp: GenerationInput, *, chat: bool, include_usage: bool, received: float, continuous_usage: bool = False
    ) -> AsyncIterator[str]:
        """Server-sent events as OpenAI sends them; the last data chunk carries usage, metrics and telemetry."""
        created = int(time.time())
        base = {
            "id": inp.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": self.arm.served_model_name,
        }

        def chunk(delta_text: str | None, finish_reason: str | None, *, first: bool = False) -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if first else {}
                if delta_text is not None:
                    delta["content"] = delta_text
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            else:
                choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish_reason}
            return {**base, "choices": [choice]}

        first = True
        produced = 0
        try:
            async for event in self.engine.generate(inp):
                if isinstance(event, TextDelta):
                    produced += event.tokens
                    payload = chunk(event.text, None, first=first)
                    if continuous_usage:
                        payload["usage"] = usage(event.prompt_tokens, produced)
                    yield _sse(payload)
                    first = False
                    continue
                extra = {
                    "metrics": {"speculative_decoding": event.spec_decode_metrics},
                    "specdrill": self.telemetry(event, request_id=inp.request_id, received=received),
                }
                last = chunk(None if chat else "", event.finish_reason, first=first)
                if include_usage:
                    yield _sse(last)
                    yield _sse(
                        {**base, "choices": [], "usage": usage(event.prompt_tokens, event.completion_tokens), **extra}
                    )
                else:
                    yield _sse({**last, **extra})
        except EngineDead as exc:
            # Headers are sent: the stream ends with OpenAI's error event (as vLLM's server does), so the client
            # records why rather than a broken stream.
            yield _sse(engine_dead_body(str(exc)))
        yield "data: [DONE]\n\n"


def schedule_dropped(configured: dict[str, Any] | None, resolved: dict[str, Any] | None) -> bool:
    key = "num_speculative_tokens_per_batch_size"
    wanted = configured is not None and configured.get(key) is not None
    return wanted and (resolved is None or resolved.get(key) is None)


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
