"""A null OpenAI-compatible streaming server: measures load generators, and misbehaves on request.

    python -m loadshapes.null_server --port 8100 [--chunks 16 --tokens-per-chunk 1 --chunk-delay 0]

Behaviour is set per server (`NullConfig`) and can be changed while it runs through POST /null/config, so a
test can make it stall (hold every request that arrives before `stall_until` epoch seconds) or fail in a given
way (`fault`: http_500, http_429, truncated, invalid_json, no_usage, reset, hang).
Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

Fault = Literal["none", "http_500", "http_429", "truncated", "invalid_json", "no_usage", "reset", "hang"]


class NullConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chunks: int = Field(default=16, ge=1)
    tokens_per_chunk: int = Field(default=1, ge=1)
    chunk_delay_s: float = Field(default=0.0, ge=0)
    first_token_delay_s: float = Field(default=0.0, ge=0)
    stall_until: float = 0.0  # epoch seconds; requests arriving before it wait until then
    fault: Fault = "none"


class NullServer:
    def __init__(self, config: NullConfig | None = None) -> None:
        self.config = config or NullConfig()
        self.received = 0
        self.received_ids: list[str] = []
        self.receive_times: list[float] = []
        self.closing = False
        self.authorization: list[str | None] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/null/config", self.set_config)
        app.router.add_get("/null/stats", self.stats)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "null-model", "object": "model"}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def set_config(self, request: web.Request) -> web.Response:
        self.config = NullConfig.model_validate({**self.config.model_dump(), **await request.json()})
        return web.json_response(self.config.model_dump())

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"received": self.received, "ids": self.received_ids})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.time()
        self.received += 1
        self.receive_times.append(arrived)
        request_id = request.headers.get("x-request-id", f"null-{self.received}")
        self.received_ids.append(request_id)
        self.authorization.append(request.headers.get("Authorization"))
        body = await request.json()
        cfg = self.config
        if cfg.stall_until > arrived:
            await asyncio.sleep(cfg.stall_until - arrived)
        if cfg.fault in ("http_500", "http_429"):
            status = int(cfg.fault[5:])
            return web.json_response({"error": {"message": f"null server fault {status}"}}, status=status)
        if cfg.fault == "hang":
            while not self.closing:
                await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if cfg.fault == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        chat = request.path.endswith("/chat/completions")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-request-id": request_id})
        await response.prepare(request)
        prompt_tokens = int((body.get("specdrill") or {}).get("prompt_tokens", 8))
        base = {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion", "model": "null"}
        if cfg.first_token_delay_s:
            await asyncio.sleep(cfg.first_token_delay_s)
        produced = 0
        for i in range(cfg.chunks):
            if i and cfg.chunk_delay_s:
                await asyncio.sleep(cfg.chunk_delay_s)
            produced += cfg.tokens_per_chunk
            text = " tok" * cfg.tokens_per_chunk
            choice: dict[str, Any] = (
                {"index": 0, "delta": {"content": text}, "finish_reason": None}
                if chat
                else {"index": 0, "text": text, "finish_reason": None}
            )
            payload: dict[str, Any] = {**base, "choices": [choice]}
            if cfg.fault != "no_usage":
                payload["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": produced}
            await response.write(_sse(payload))
            if cfg.fault == "truncated" and i == cfg.chunks // 2:
                assert request.transport is not None
                request.transport.abort()
                return response
        if cfg.fault == "invalid_json":
            await response.write(b"data: {not json\n\n")
        final: dict[str, Any] = {**base, "choices": []}
        if cfg.fault != "no_usage":
            final["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": produced}
        await response.write(_sse(final))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class ServerThread:
    """The server on its own event loop in a daemon thread (tests); `stop()` closes it."""

    def __init__(self, server: NullServer, port: int = 0) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = port
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("null server did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self._runner = web.AppRunner(self.server.app(), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.closing = True

        async def shutdown() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    config = NullConfig(chunks=args.chunks, tokens_per_chunk=args.tokens_per_chunk, chunk_delay_s=args.chunk_delay)
    web.run_app(NullServer(config).app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
