"""OpenAI streaming servers that speak SGLang's and TensorRT-LLM's speculation telemetry as their code writes it
(neither engine runs on this machine; docs/engineering/other-engines.md cites each format). Each request of n
tokens runs n // (1 + accepted) verify steps at the draft length its server's rule gives for the batch it joined;
the counters and gauges move as the engines' collectors move them; /metrics text is prometheus_client's, as in
both engines. Loopback only, on a free port (tools.localray.free_port via ServerThread)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any, cast

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from loadshapes.null_server import NullServer, ServerThread


class DialectServer:
    """Streams `tokens` one-token chunks `delay_s` apart; `steps_for(running)` is the draft length in force."""

    metrics_path = "/metrics"

    def __init__(self, *, tokens: int = 12, delay_s: float = 0.01, accepted: int = 1, model: str = "m") -> None:
        self.tokens, self.delay_s, self.accepted, self.model = tokens, delay_s, accepted, model
        self.running = 0
        self.registry = CollectorRegistry()
        self.decode_batches = 0

    def steps_for(self, running: int) -> int:
        return 3 if running < 4 else 1

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get(self.metrics_path, self.prometheus)
        return app

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")

    def chunk(self, rid: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {"id": rid, "object": "text_completion", "created": created, "model": self.model, "choices": choices}
        return f"data: {json.dumps({**body, **extra}, separators=(',', ':'))}\n\n".encode()

    def on_step(self, steps: int) -> None:
        """One decode batch of this server (a streamed token)."""

    def finished(self, request: dict[str, Any], verify: int, steps: int) -> list[bytes]:
        """The chunks after the last content chunk (speculation details, usage), and the counters' update."""
        return []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        rid, created = f"cmpl-{time.monotonic_ns()}", int(time.time())
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        n = min(int(body.get("max_tokens") or self.tokens), self.tokens)
        self.running += 1
        steps = self.steps_for(self.running)
        try:
            for i in range(n):
                await asyncio.sleep(self.delay_s)
                self.on_step(steps)
                finish = "length" if i == n - 1 else None
                choice = {"index": 0, "text": "tok ", "logprobs": None, "finish_reason": finish, "matched_stop": None}
                usage = self.usage(5, i + 1) if continuous else None
                await response.write(self.chunk(rid, created, [choice], usage=usage))
            verify = math.ceil(n / (1 + self.accepted)) if steps else 0
            for part in self.finished(body | {"_id": rid, "_created": created, "_n": n}, verify, steps):
                await response.write(part)
            await response.write(b"data: [DONE]\n\n")
        finally:
            self.running -= 1
        return response

    @staticmethod
    def usage(prompt: int, completion: int) -> dict[str, Any]:
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
                "prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}  # fmt: skip


class SglangServer(DialectServer):
    """SGLang 0.5.23 with --enable-metrics and an adaptive draft length (3 steps below 4 running, else 1)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        scheduler = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        self.labels = {"model_name": self.model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                       "moe_ep_rank": "0"}  # fmt: skip
        self.num_running = Gauge("sglang:num_running_reqs", "", scheduler, registry=self.registry)
        self.num_queue = Gauge("sglang:num_queue_reqs", "", scheduler, registry=self.registry)
        self.spec_num_steps = Gauge("sglang:spec_num_steps", "", scheduler, registry=self.registry)
        self.verify_calls = Counter("sglang:spec_verify_calls_total", "", ["model_name"], registry=self.registry)
        self.generation = Counter(
            "sglang:generation_tokens_total", "", ["model_name", "is_streaming"], registry=self.registry
        )
        self.configured_steps = 3  # --speculative-num-steps: proposed drafts are counted at this width

    def on_step(self, steps: int) -> None:
        # The scheduler logs its stats (and so sets its gauges) every decode_log_interval = 40 decode batches.
        self.decode_batches += 1
        if self.decode_batches % 40 == 0:
            self.num_running.labels(**self.labels).set(self.running)
            self.num_queue.labels(**self.labels).set(0)
            self.spec_num_steps.labels(**self.labels).set(steps)

    def finished(self, request: dict[str, Any], verify: int, steps: int) -> list[bytes]:
        n = request["_n"]
        self.generation.labels(model_name=self.model, is_streaming="true").inc(n)
        if verify > 0:
            self.verify_calls.labels(model_name=self.model).inc(verify)
        parts = []
        if request.get("return_spec_tokens_details") and verify > 0:
            proposed = verify * self.configured_steps  # verify_ct * (speculative_num_draft_tokens - 1)
            correct = n - verify
            details = {
                "spec_accept_rate": correct / proposed, "spec_accept_length": n / verify, "spec_cap_length": 0.0,
                "spec_block_accept_length": 0.0, "spec_num_correct_drafts": correct,
                "spec_num_proposed_drafts": proposed, "spec_verify_ct": verify,
                "spec_correct_drafts_histogram": [0, verify], "spec_cap_lens_histogram": [],
            }  # fmt: skip
            parts.append(self.chunk(request["_id"], request["_created"], [], usage=None,
                                    sglext={"spec_tokens_details": details}))  # fmt: skip
        if (request.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 5, "total_tokens": 5 + n, "completion_tokens": n, "reasoning_tokens": 0}
            parts.append(self.chunk(request["_id"], request["_created"], [], usage=usage))
        return parts


class TrtllmServer(DialectServer):
    """trtllm-serve with enable_iter_perf_stats: Prometheus at /prometheus/metrics, iteration stats JSON at
    /metrics (drained on read), nothing about speculation per request."""

    metrics_path = "/prometheus/metrics"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        labels = ["model_name", "engine_type"]
        self.labels = {"model_name": self.model, "engine_type": "trtllm"}
        self.num_running = Gauge("trtllm_num_requests_running", "", labels, registry=self.registry)
        self.num_waiting = Gauge("trtllm_num_requests_waiting", "", labels, registry=self.registry)
        self.draft_tokens = Counter("trtllm_spec_decode_num_draft_tokens_total", "", labels, registry=self.registry)
        self.accepted_tokens = Counter(
            "trtllm_spec_decode_num_accepted_tokens_total", "", labels, registry=self.registry
        )
        self.generation = Counter("trtllm_generation_tokens_total", "", labels, registry=self.registry)
        self.iterations: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/metrics", self.iteration_stats)
        return app

    async def iteration_stats(self, _: web.Request) -> web.Response:
        drained, self.iterations = self.iterations, []
        return web.json_response(drained)

    def on_step(self, steps: int) -> None:
        # One request's share of an iteration: its drafts and accepted drafts enter the counters via the stats.
        accepted = min(self.accepted, steps)
        stats = {"numActiveRequests": self.running, "numQueuedRequests": 0,
                 "specDecodingStats": {"numDraftTokens": steps, "numAcceptedTokens": accepted,
                                       "numRequestsWithDraftTokens": 1 if steps else 0,
                                       "acceptanceLength": 1 + accepted}}  # fmt: skip
        self.iterations.append(stats)
        self.num_running.labels(**self.labels).set(self.running)
        self.num_waiting.labels(**self.labels).set(0)
        if steps:
            self.draft_tokens.labels(**self.labels).inc(steps)
        if accepted:
            self.accepted_tokens.labels(**self.labels).inc(accepted)

    def finished(self, request: dict[str, Any], verify: int, steps: int) -> list[bytes]:
        self.generation.labels(**self.labels).inc(request["_n"])
        if (request.get("stream_options") or {}).get("include_usage"):
            usage = self.usage(5, request["_n"])
            return [self.chunk(request["_id"], request["_created"], [], usage=usage)]
        return []


def serve(server: DialectServer) -> ServerThread:
    """The server on its own loop in a daemon thread (ServerThread asks only for `app()`)."""
    return ServerThread(cast(NullServer, server))
