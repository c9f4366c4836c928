"""Virtual time: discrete events, as fast as the CPU goes. For offline what-if runs and calibration."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serve_apps.sim.engine import EngineCore
from serve_apps.sim.request import RequestRecord, SimRequest


@dataclass(frozen=True, slots=True)
class VirtualRun:
    records: list[RequestRecord]
    unfinished: list[SimRequest]
    end: float


def run_open_loop(core: EngineCore, arrivals: Sequence[SimRequest], *, stop_at: float = math.inf) -> VirtualRun:
    """Feed requests at their arrival times; stop when all are done or the engine's clock passes stop_at."""
    pending = sorted(arrivals, key=lambda r: r.arrival)
    finished: list[SimRequest] = []
    now = pending[0].arrival if pending else 0.0
    i = 0
    while (i < len(pending) or core.has_work()) and now <= stop_at:
        while i < len(pending) and pending[i].arrival <= now:
            core.add_request(pending[i])
            i += 1
        if not core.has_work():
            now = pending[i].arrival
            continue
        next_arrival = pending[i].arrival if i < len(pending) else math.inf
        outcome = core.run_steps(now, next_arrival=next_arrival)
        if outcome.steps == 0:
            # Nothing fit (e.g. the KV cache is full of waiting work): wait for the next arrival.
            if i == len(pending):
                raise RuntimeError("simulated engine is stuck: work queued but nothing can be scheduled")
            now = next_arrival
            continue
        now = outcome.end
        finished.extend(outcome.finished)
    unfinished = [*core.running, *core.waiting, *pending[i:]]
    return VirtualRun(records=core.records_for(finished), unfinished=unfinished, end=now)


def run_closed_loop(
    core: EngineCore,
    make_request: Callable[[int, float], SimRequest],
    *,
    concurrency: int,
    total_requests: int,
) -> VirtualRun:
    """Keep `concurrency` requests in the engine: each finish is replaced at once (a fixed batch size)."""
    finished: list[SimRequest] = []
    now = 0.0
    issued = 0
    for _ in range(min(concurrency, total_requests)):
        core.add_request(make_request(issued, now))
        issued += 1
    while core.has_work():
        outcome = core.run_steps(now, stop_on_finish=issued < total_requests)
        if outcome.steps == 0:
            raise RuntimeError("simulated engine is stuck: work queued but nothing can be scheduled")
        now = outcome.end
        for request in outcome.finished:
            finished.append(request)
            if issued < total_requests:
                core.add_request(make_request(issued, now))
                issued += 1
    return VirtualRun(records=core.records_for(finished), unfinished=[], end=now)
