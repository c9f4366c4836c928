"""CPU per streamed request: geventhttpclient's `request()` (Locust's FastHttpUser library, what the load worker
used before) against the worker's wire client (loadshapes/wire.py), one request at a time, same null server.

Run by bench_loadgen.py pinned to one core (a gevent process: it monkey-patches); prints one JSON line.

    python benchmarks/http_client_cost.py http://127.0.0.1:8731 [requests]
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent.event  # noqa: E402
from geventhttpclient import HTTPClient  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadshapes.http_framing import request_bytes, request_head  # noqa: E402
from loadshapes.wire import Exchange, WireClient  # noqa: E402
from timebase.clock import now_ns  # noqa: E402

BODY = json.dumps({
    "model": "null-model", "prompt": "x " * 16, "max_tokens": 16, "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}).encode()  # fmt: skip
HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}


def geventhttpclient_request(host: str, port: int) -> Callable[[int], int]:
    """As the worker used it: request(), then the body as each socket read delivers it, each read stamped."""
    http = HTTPClient(host, port, concurrency=8)

    def one(index: int) -> int:
        response = http.request("POST", "/v1/completions", body=BODY, headers={**HEADERS, "x-request-id": f"r{index}"})
        buffer, reads = response._body_buffer, 0
        while True:
            if buffer:
                _ = (bytes(buffer), now_ns())
                del buffer[:]
            if response.message_complete:
                break
            sock = response._sock
            assert sock is not None
            response.feed(sock.recv(response.block_size))
            reads += 1
        response.release()
        return reads

    return one


def wire_client(host: str, port: int) -> Callable[[int], int]:
    answered = gevent.event.Event()
    client = WireClient(host, port, tls=None, max_connections=8, timeout_s=30, on_done=lambda _: answered.set())
    head = request_head("POST", host, port, "/v1/completions", dict(HEADERS), tls=False)

    def one(index: int) -> int:
        exchange = Exchange(request_bytes(head, BODY, f"r{index}"))
        answered.clear()
        client.submit(exchange)
        answered.wait()
        assert exchange.done_ns is not None, exchange.failure
        return len(exchange.chunks)

    return one


def cost(one: Callable[[int], int], requests: int) -> dict[str, float]:
    for index in range(200):  # warm: connections, caches
        one(index)
    cpu, wall, reads = time.process_time(), time.perf_counter(), 0
    for index in range(requests):
        reads += one(index)
    return {
        "cpu_us_per_request": (time.process_time() - cpu) / requests * 1e6,
        "wall_us_per_request": (time.perf_counter() - wall) / requests * 1e6,
        "socket_reads_per_request": reads / requests,
    }


def main() -> None:
    url = urllib.parse.urlsplit(sys.argv[1])
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    host, port = url.hostname or "127.0.0.1", url.port or 80
    results: dict[str, list[dict[str, float]]] = {}
    for _ in range(2):  # interleaved, so a change in the host's noise falls on both
        for name, make in (("geventhttpclient", geventhttpclient_request), ("wire", wire_client)):
            results.setdefault(name, []).append(cost(make(host, port), requests))
    best = {name: min(runs, key=lambda r: r["cpu_us_per_request"]) for name, runs in results.items()}
    ratio = best["geventhttpclient"]["cpu_us_per_request"] / best["wire"]["cpu_us_per_request"]
    print(json.dumps({**best, "cpu_ratio_geventhttpclient_over_wire": ratio}))


if __name__ == "__main__":
    main()
