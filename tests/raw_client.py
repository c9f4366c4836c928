"""The raw client: a minimal asyncio + aiohttp open-loop client (benchmarks/bench_loadgen.py's baseline), run beside
a load worker in the same test against the same server on the same schedule, so that the worker's send lateness is
judged against what this host gives a minimal client at that moment, not against a fixed number of milliseconds
that a busy shared host breaks (issue 40). Lateness, as the worker's: when a request is dispatched (its task
starts) minus its scheduled time, on specdrill's clock (timebase.clock, one clock across processes).

    python -m tests.raw_client URL START_NS OFFSETS_JSON   ->  prints the lateness of each request, seconds (JSON)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence

import numpy as np

from tests import REPO


def start(url: str, start_ns: int, offsets: Sequence[float]) -> subprocess.Popen[str]:
    """The client in a process of its own (as the worker is), sending to `url` at start_ns + each offset."""
    command = [sys.executable, "-m", "tests.raw_client", url, str(start_ns), json.dumps(list(offsets))]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def lateness(process: subprocess.Popen[str], timeout_s: float = 120) -> np.ndarray:
    """The lateness of each request in schedule order, seconds."""
    out, err = process.communicate(timeout=timeout_s)
    if process.returncode != 0:
        raise RuntimeError(f"raw client failed ({process.returncode}): {err[-2000:]}")
    return np.array(json.loads(out.strip().splitlines()[-1]))


async def _run(url: str, start_ns: int, offsets: list[float]) -> list[float]:
    import aiohttp

    from timebase.clock import now_ns

    body = {"model": "null", "prompt": "x", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    late = [0.0] * len(offsets)

    async def one(session: aiohttp.ClientSession, i: int, due: int) -> None:
        late[i] = (now_ns() - due) / 1e9
        try:
            async with session.post(url, json=body) as response:
                async for _ in response.content:
                    pass
        except (aiohttp.ClientError, TimeoutError):
            pass  # what came back is not this client's measure

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = []
        for i, offset in enumerate(offsets):
            due = start_ns + round(offset * 1e9)
            delay = (due - now_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, i, due)))
        await asyncio.wait(tasks, timeout=60)
    return late


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_run(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])))))
