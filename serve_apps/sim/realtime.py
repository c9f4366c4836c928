"""Real time: the engine core driven by asyncio, for serving behind Ray Serve.

One engine step of `d` simulated seconds takes `d * time_scale` wall seconds, so a 2-core machine can keep up
with simulated H100 speed (time_scale > 1 slows the simulated hardware down uniformly). Requests see tokens at
the wall time their step ends. Records come back in wall-clock time on specdrill's clock.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from serve_apps.sim.engine import EngineCore
from serve_apps.sim.request import RequestRecord, SimRequest
from timebase import clock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TokenBatch:
    count: int
    time: float  # wall clock (specdrill clock) when these tokens were produced


@dataclass(frozen=True, slots=True)
class Finished:
    record: RequestRecord  # timestamps in wall-clock time


class LoopDied(RuntimeError):
    """The engine loop raised: every request in flight, and every later one, fails with this."""


class RealtimeEngine:
    def __init__(self, core: EngineCore, *, time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.core = core
        self.time_scale = time_scale
        self._t0 = clock.now()
        self._queues: dict[int, asyncio.Queue[TokenBatch | Finished | LoopDied]] = {}  # by request uid
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._engine_time = 0.0  # simulated seconds at which the engine is free again
        self.max_lag = 0.0  # worst wall-clock lateness of a step end, seconds
        # Engine lag, one value per step (aligned with core.steps): how late the step's tokens were handed out
        # after the wall time the model says the step ends. The engine's counterpart of send lateness: where it
        # is large the host could not keep up, and latencies are the host's, not the model's.
        self.step_lag = array.array("d")
        self.failure: LoopDied | None = None  # set when the loop raised; the engine serves nothing after it

    def to_wall(self, engine_seconds: float) -> float:
        return self._t0 + engine_seconds * self.time_scale

    def engine_now(self) -> float:
        return (clock.now() - self._t0) / self.time_scale

    def start(self) -> None:
        if self._task is None and self.failure is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.core.engine_id}-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def generate(self, request: SimRequest) -> AsyncIterator[TokenBatch | Finished]:
        """Submit a request and stream its tokens; the last item is Finished with the full record."""
        self.start()
        if self.failure is not None:
            raise self.failure
        request.arrival = self.engine_now()
        queue: asyncio.Queue[TokenBatch | Finished | LoopDied] = asyncio.Queue()
        self.core.add_request(request)
        self._queues[request.uid] = queue
        self._wake.set()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, LoopDied):
                    raise item
                yield item
                if isinstance(item, Finished):
                    return
        finally:
            if self._queues.pop(request.uid, None) is not None and not request.finished and self.failure is None:
                self.core.abort(request)  # the client went away: free its KV blocks

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception as exc:  # a bug or a broken profile: fail what is in flight instead of leaving it hanging
            self.failure = LoopDied(f"the simulated engine's loop died: {type(exc).__name__}: {exc}")
            for queue in self._queues.values():
                queue.put_nowait(self.failure)
            log.exception("%s", self.failure)

    async def _loop(self) -> None:
        while True:
            if not self.core.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            start = max(self.engine_now(), self._engine_time)
            outcome = self.core.run_steps(start, max_steps=1)
            if outcome.steps == 0:
                # Queued work that cannot be scheduled yet; look again shortly.
                await asyncio.sleep(0.001 * self.time_scale)
                continue
            self._engine_time = outcome.end
            end_wall = self.to_wall(outcome.end)
            delay = end_wall - clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(0.0, clock.now() - end_wall)  # the sleep itself may overshoot on a busy host
            self.step_lag.extend([lag] * outcome.steps)
            self.max_lag = max(self.max_lag, lag)
            for uid, count in outcome.tokens_by_uid().items():
                queue = self._queues.get(uid)
                if queue is not None:
                    queue.put_nowait(TokenBatch(count=count, time=end_wall))
            for record, request in zip(self.core.records_for(outcome.finished), outcome.finished, strict=True):
                queue = self._queues.get(request.uid)
                if queue is not None:
                    queue.put_nowait(Finished(self._wall_record(record)))

    def _wall_record(self, record: RequestRecord) -> RequestRecord:
        return dataclasses.replace(
            record,
            arrival=self.to_wall(record.arrival),
            first_scheduled=self.to_wall(record.first_scheduled),
            first_token=self.to_wall(record.first_token),
            finished=self.to_wall(record.finished),
            token_times=self._t0 + record.token_times * self.time_scale,
        )
