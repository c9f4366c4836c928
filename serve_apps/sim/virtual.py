"""Virtual time: discrete events, as fast as the CPU goes. The one driver of simulated engine cores in virtual
time (the real-time one is serve_apps/sim/realtime.py): a campaign's units, `tune`'s played traffic, fixed-batch
experiments, the oracle and ground truth all step their engines here, in one of two traffic forms:

- open loop (`run_open_loop`): requests at arrival times known ahead, whatever the engine does;
- closed loop (`run_closed_loop`): users, each sending its next request when its previous one ends (a fixed
  batch size is `concurrency` such users).
"""

from __future__ import annotations

import heapq
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


# What a closed-loop user's send gives the driver: None, the user's loop is over; (engine, None), refused before
# it reached the engine (the user sends again `retry_s` later); (engine, request), in the engine from `at` on.
Send = Callable[[int, float], "tuple[int, SimRequest | None] | None"]


def run_closed_loop(
    cores: Sequence[EngineCore], send: Send, *, users: int, stop_at: float = math.inf, retry_s: float = 0.0
) -> list[list[RequestRecord]]:
    """`users` users, each sending its next request (`send(user, at)`) when its previous one ends, until every
    user is done and nothing is in flight, or the engines' clocks pass `stop_at`. The finished requests' records,
    per engine.

    With several engines a finish on one can send a request to another, so the engine furthest behind in time
    always steps next, and stops at every finish (its user's next request may go anywhere).
    """
    clocks = [0.0] * len(cores)
    owner: dict[str, int] = {}  # request id -> user
    finished: list[list[SimRequest]] = [[] for _ in cores]
    sends: list[tuple[float, int, int]] = [(0.0, u, u) for u in range(users)]  # (engine time, tie-break, user)
    heapq.heapify(sends)
    ticket = users
    while True:
        busy = [e for e, core in enumerate(cores) if core.has_work()]
        earliest = min((clocks[e] for e in busy), default=math.inf)
        if sends and sends[0][0] <= earliest:
            at, _, user = heapq.heappop(sends)
            sent = send(user, at)
            if sent is None:
                continue
            rank, request = sent
            if request is None:
                heapq.heappush(sends, (at + retry_s, ticket, user))
                ticket += 1
                continue
            owner[request.request_id] = user
            if not cores[rank].has_work():
                clocks[rank] = max(clocks[rank], at)  # an idle engine starts when the request arrives
            cores[rank].add_request(request)
            continue
        if not busy or earliest > stop_at:
            break  # every user is done and nothing is in flight, or the clocks passed the stop
        e = min(busy, key=lambda i: clocks[i])
        others = min((clocks[i] for i in busy if i != e), default=math.inf)
        outcome = cores[e].run_steps(clocks[e], next_arrival=min(others, sends[0][0] if sends else math.inf),
                                     stop_on_finish=True)  # fmt: skip
        if outcome.steps == 0:
            raise RuntimeError(f"simulated engine {cores[e].engine_id} is stuck: work queued, none schedulable")
        clocks[e] = outcome.end
        finished[e] += outcome.finished
        for request in outcome.finished:
            assert request.finished_at is not None
            heapq.heappush(sends, (request.finished_at, ticket, owner[request.request_id]))
            ticket += 1
    # Records once per engine at the end: records_for reads the whole step table on every call.
    return [core.records_for(done) for core, done in zip(cores, finished, strict=True)]
