"""The Locust side of a load worker: an open-loop (or closed-loop) OpenAI streaming client writing trace rows.

The orchestrator starts it in a subprocess of a Ray actor (orchestrator/execute/load_workers.py); it also runs by hand:

    SPECDRILL_LOAD_PLAN=plan.yaml locust -f loadshapes/locustfile.py --headless

Open loop: one dispatcher user hands every planned request to the wire client (loadshapes/wire.py) at its
scheduled time, whether or not earlier ones have finished, so a stalled server shows in the latency of everything
scheduled during the stall (no coordinated omission). Latency counts from the scheduled time and send lateness
(dispatch minus scheduled: how late the worker itself was) is recorded.
Results come from the trace rows written here, never from Locust's statistics.

This file holds only what Locust looks for in a locustfile: the user classes, the shape and the init listener.
Importing it creates nothing: the worker (loadshapes/worker/) is made when Locust fires `init`, which is also
where the plan is read from the environment. Import it only in a Locust process: Locust monkey-patches the
interpreter with gevent.
"""

from __future__ import annotations

import sys
from typing import Any

from locust import LoadTestShape, User, events, task
from locust.env import Environment
from locust.exception import StopUser

from loadshapes.plan import closed_loop_users
from loadshapes.worker.state import WorkerState, load_plan
from timebase.clock import now_ns

_worker: WorkerState | None = None  # this process's worker, made by `_make_worker` when Locust fires init


def _current() -> WorkerState:
    assert _worker is not None, "the load worker is made when Locust fires init"
    return _worker


class _SpecdrillUser(User):
    """Locust manages these users; their HTTP goes through the worker's one wire client (loadshapes/wire.py), not
    FastHttpUser's: the worker needs every microsecond for send accuracy."""

    abstract = True  # host: the plan's base URL, set at init


class OpenLoopDispatcher(_SpecdrillUser):
    """Sends the plan's schedule: each request at its time, whatever is still in flight."""

    fixed_count = 1

    @task
    def dispatch(self) -> None:
        worker = _current()
        if not worker.sender.send_schedule():
            return  # stopped mid-schedule: the stop wrote every row
        worker.sender.wait_drained(worker.plan.drain_s)
        worker.stop()
        # Done: leave now, so Locust's stop does not wait out its stop timeout for a user that never ends.
        raise StopUser


class ClosedLoopUser(_SpecdrillUser):
    """CLOSED LOOP: sends its next request as soon as the previous one ends, until the shape's duration."""

    @task
    def loop(self) -> None:
        _current().sender.send_closed_loop()
        raise StopUser  # the shape stops the run once nothing is in flight


class PlanShape(LoadTestShape):
    """Locust's view of the plan: one dispatcher for an open-loop shape (the arrival times are in the plan),
    this worker's share of the users for a closed-loop one. Ends the run when the plan is done."""

    def tick(self) -> tuple[int, float, list[type[User]] | None] | None:
        worker = _current()
        plan, pacing = worker.plan, worker.pacing
        if pacing.finished:
            return None
        if plan.shape.open_loop:
            return 1, 1.0, [OpenLoopDispatcher]
        users = closed_loop_users(plan)
        if users == 0:
            worker.stop()
            return None
        if pacing.end_ns is not None and now_ns() >= pacing.end_ns + round(plan.drain_s * 1e9):
            worker.stop()
            return None
        if pacing.end_ns is not None and now_ns() >= pacing.end_ns and not worker.sender.in_flight:
            worker.stop()
            return None
        return users, float(users), [ClosedLoopUser]


@events.init.add_listener  # type: ignore[untyped-decorator]
def _make_worker(environment: Environment, **_: Any) -> None:
    global _worker
    # Parquet rows are encoded on a worker thread; with the default 5 ms GIL switch interval that thread would hold
    # the sender up to 5 ms at a time. 0.2 ms keeps send lateness well under a millisecond.
    sys.setswitchinterval(0.0002)
    plan = load_plan()
    _worker = WorkerState(plan)
    _SpecdrillUser.host = plan.target.base_url
    environment.events.test_start.add_listener(_start_worker)  # type: ignore[no-untyped-call]
    environment.events.quitting.add_listener(_stop_worker)  # type: ignore[no-untyped-call]


def _start_worker(environment: Environment, **_: Any) -> None:
    _current().start(environment)


def _stop_worker(**_: Any) -> None:
    _current().stop()
