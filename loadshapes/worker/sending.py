"""The sending side of a load worker: the plan's schedule (open loop) or one user's back-to-back requests (closed
loop), each handed to the one wire client (loadshapes/wire.py) at its time, and what the sender measures of
itself (how late it sent, how long a request waited for a connection)."""

from __future__ import annotations

import gc
import os
import ssl
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gevent
import gevent.event

from loadshapes.http_framing import request_bytes, request_head
from loadshapes.plan import Planned, WorkerPlan, closed_loop_request, open_loop_schedule
from loadshapes.wire import Exchange, WireClient
from loadshapes.worker.sessions import TurnsNotSent, answer_of, fits, next_request
from timebase.clock import now_ns


@dataclass(slots=True, kw_only=True)
class Received(Exchange):
    """One planned request on the wire and what came back (see wire.Exchange); the bookkeeping greenlet turns
    it into the trace row."""

    index: int
    item: Planned | None
    scheduled_ns: int
    answered: gevent.event.Event | None = None  # set when it ends (closed loop: the user waits for it)


@dataclass(slots=True)
class Pacing:
    """What the parts of a worker read of each other's progress through the unit."""

    start_ns: int | None  # the unit's start (the plan's, the go file's, or soon after the first user starts)
    end_ns: int | None = None  # start plus the shape's duration
    next_due_ns: int = 0  # the dispatcher's next send time: bookkeeping waits when it is near
    sending_done: bool = False
    finished: bool = False  # the worker has stopped: every loop ends


def _has_next_turn(exchange: Exchange) -> bool:
    item = getattr(exchange, "item", None)
    return item is not None and item.session is not None and bool(item.session.later)


def first_phase(plan: WorkerPlan) -> str:
    """The phase a closed-loop request belongs to (a closed-loop shape has one)."""
    return plan.shape.phases()[0].name


class Sender:
    """Hands each request to the wire client at its time; `on_answered` gets each one that ends, once."""

    def __init__(self, plan: WorkerPlan, pacing: Pacing, on_answered: Callable[[Received], None]) -> None:
        self.plan = plan
        self.pacing = pacing
        self.on_answered = on_answered
        self.schedule: list[Planned] = open_loop_schedule(plan) if plan.shape.open_loop else []
        self.in_flight: dict[int, Received] = {}
        self.lateness_ns: list[int] = []  # dispatch minus scheduled: how late the worker itself was
        self.connection_wait_ns: list[int] = []  # send minus dispatch: waiting for a free or new connection
        self.sent = 0
        self.max_in_flight_seen = 0
        self.closed_loop_counter = 0
        # Sessions: later turns sent, turns not sent (by why), and the sessions whose next turn waits out its think
        # time (session id -> turns it has left), which the drain waits for and a stop counts.
        self.follow_ups_sent = 0
        self.last_follow_up_ns = 0
        self.turns_not_sent = TurnsNotSent()
        self.thinking: dict[int, int] = {}
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}
        headers.update(plan.target.speculation.headers)
        if plan.target.api_key_env:
            key = os.environ.get(plan.target.api_key_env)
            if not key:
                sys.exit(f"target.api_key_env: environment variable {plan.target.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        url = urllib.parse.urlsplit(plan.target.base_url)
        tls = url.scheme == "https"
        host, port = url.hostname or "127.0.0.1", url.port or (443 if tls else 80)
        path = url.path.rstrip("/") + plan.target.path
        self.request_head = request_head("POST", host, port, path, headers, tls=tls)
        try:
            self.client = WireClient(
                host, port, tls=ssl.create_default_context() if tls else None, max_connections=plan.max_in_flight,
                timeout_s=plan.request_timeout_s, on_done=self.answered,
            )  # fmt: skip
        except OSError as exc:  # the host does not resolve
            sys.exit(f"target.base_url: cannot resolve {host}: {exc}")

    def wait_for_start(self) -> int:
        pacing = self.pacing
        if pacing.start_ns is None:
            if self.plan.go_file:
                go = Path(self.plan.go_file)
                while not go.exists():
                    gevent.sleep(0.005)
                pacing.start_ns = int(go.read_text(encoding="utf-8"))
            else:
                pacing.start_ns = now_ns() + 500_000_000
        pacing.end_ns = pacing.start_ns + round(self.plan.shape.duration * 1e9)
        # From here the cyclic GC stays off (see _GC_LIVE_YOUNG_OBJECTS in rows.py); what is alive now is frozen
        # out of it.
        gc.collect()
        gc.freeze()
        gc.disable()
        return pacing.start_ns

    def send_schedule(self) -> bool:
        """Open loop: each planned request at its time, whatever is still in flight; False when the worker
        stopped first."""
        start = self.wait_for_start()
        spin_ns = round(self.plan.spin_s * 1e9)
        for item in self.schedule:
            if self.pacing.finished:
                return False
            due = start + round(item.offset_s * 1e9)
            self.pacing.next_due_ns = due
            delay = due - now_ns()
            if delay > spin_ns:
                gevent.sleep((delay - spin_ns) / 1e9)
            while now_ns() < due:
                gevent.sleep(0)  # poll the loop (other greenlets run) for sub-millisecond send accuracy
            self.submit(item.index, item, due)
        self.pacing.sending_done = True
        return True

    def send_closed_loop(self) -> None:
        """Closed loop, one user: the next request as soon as the previous one ends, until the shape's duration."""
        plan = self.plan
        self.wait_for_start()
        assert self.pacing.end_ns is not None
        while now_ns() < self.pacing.end_ns and not self.pacing.finished:
            index = plan.worker + plan.workers * self.closed_loop_counter
            self.closed_loop_counter += 1
            item = closed_loop_request(plan, index)
            received: Received | None = self.send_and_wait(index, item, now_ns())
            # A session: the user plays its later turns before its next arrival.
            while received is not None and _has_next_turn(received):
                received = self.play_turn(received)

    def next_turn(self, received: Received) -> tuple[Planned, int] | None:
        """A session's next request and when it is due (the answer's end plus the think time, or now if building
        it took longer), or None where it is not sent (counted; at a stop, close() counted it)."""
        item = received.item
        assert item is not None and item.session is not None
        left = len(item.session.later)
        if self.pacing.finished:
            return None
        answer = answer_of(received)
        if answer is None:
            self.turns_not_sent.after_failure += left
            return None
        assert received.done_ns is not None and self.pacing.start_ns is not None and self.pacing.end_ns is not None
        due = max(received.done_ns + round(item.session.think_time_s * 1e9), now_ns())
        if due >= self.pacing.end_ns:
            self.turns_not_sent.after_end += left
            return None
        follow = next_request(self.plan, item, answer, (due - self.pacing.start_ns) / 1e9)
        if not fits(follow):
            self.turns_not_sent.over_max_model_len += left
            return None
        return follow, due

    def play_turn(self, received: Received) -> Received | None:
        """A session's next turn after `received`'s answer, sent at its time (open loop: from its own greenlet,
        not waited for; closed loop: the user waits for its answer); None where it is not sent. From the answer
        until the send the session is `thinking`: a stop counts its turns as not sent."""
        assert received.item is not None and received.item.session is not None
        session = received.item.session
        self.thinking[session.session_id] = len(session.later)
        try:
            planned = self.next_turn(received)
            if planned is None:
                return None
            item, due = planned
            # As the schedule's sends: a timer to the last stretch, then polling the loop (timers wake ~1 ms late).
            delay, spin_ns = due - now_ns(), round(self.plan.spin_s * 1e9)
            if delay > spin_ns:
                gevent.sleep((delay - spin_ns) / 1e9)
            while now_ns() < due and not self.pacing.finished:
                gevent.sleep(0)
            if self.pacing.finished:
                return None
        finally:
            self.thinking.pop(session.session_id, None)
        self.follow_ups_sent += 1
        self.last_follow_up_ns = due
        if self.plan.shape.open_loop:
            return self.submit(item.index, item, due)
        return self.send_and_wait(item.index, item, due)

    # Sending keeps priority over bookkeeping on the worker's one core: the wire client writes each request as it
    # is due and stamps every socket read from the event loop (loadshapes/wire.py); the row is built later, by the
    # bookkeeping greenlet (rows.py), in the gaps between scheduled sends.
    def submit(
        self, index: int, item: Planned | None, scheduled_ns: int, answered: gevent.event.Event | None = None
    ) -> Received:
        body = item.body if item else b""
        request = request_bytes(self.request_head, body, self.plan.request_id(index))
        received = Received(request=request, index=index, item=item, scheduled_ns=scheduled_ns, answered=answered)
        self.in_flight[index] = received
        if len(self.in_flight) > self.max_in_flight_seen:
            self.max_in_flight_seen = len(self.in_flight)
        self.sent += 1
        self.client.submit(received)
        assert received.dispatched_ns is not None
        self.lateness_ns.append(received.dispatched_ns - scheduled_ns)
        return received

    def answered(self, exchange: Exchange) -> None:
        """From the event loop, once per request: queue it for its row."""
        assert isinstance(exchange, Received)
        if self.in_flight.pop(exchange.index, None) is None:
            return  # already written as cancelled
        if exchange.sent_ns is not None and exchange.dispatched_ns is not None:
            self.connection_wait_ns.append(exchange.sent_ns - exchange.dispatched_ns)
        self.on_answered(exchange)
        if exchange.answered is not None:
            exchange.answered.set()
        elif _has_next_turn(exchange):
            # Open loop: the answer is decoded off the event loop; the session counts as thinking from now.
            assert exchange.item is not None and exchange.item.session is not None
            self.thinking[exchange.item.session.session_id] = len(exchange.item.session.later)
            gevent.spawn(self.play_turn, exchange)

    def send_and_wait(self, index: int, item: Planned, scheduled_ns: int) -> Received:
        """Closed loop: the next request only once this one has ended."""
        answered = gevent.event.Event()  # set by `answered`, or by the stop
        received = self.submit(index, item, scheduled_ns, answered)
        answered.wait()
        return received

    def expire_periodically(self) -> None:
        interval = min(0.1, self.plan.request_timeout_s / 10)
        while not self.pacing.finished:
            gevent.sleep(interval)
            if not self.pacing.finished:
                self.client.expire()

    def wait_drained(self, timeout_s: float) -> None:
        """Until nothing is in flight, at most `timeout_s` after the last send; a session's next turn still in its
        think time is waited for (it is sent before the shape's end or not at all)."""
        drain_ns, started = round(timeout_s * 1e9), now_ns()
        while self.in_flight or self.thinking:
            if not self.thinking and now_ns() > max(started, self.last_follow_up_ns) + drain_ns:
                return
            gevent.sleep(0.01)

    def close(self) -> dict[int, Received]:
        """Stop sending: close the client (no callback comes after this) and hand over what is still in flight."""
        self.client.close()
        # Every turn a session had left is counted here, once: those in their think time, those after a turn in
        # flight (play_turn and next_turn count nothing once the worker has finished).
        in_flight = [r for r in self.in_flight.values() if _has_next_turn(r)]
        self.turns_not_sent.at_stop += sum(self.thinking.values()) + sum(
            len(r.item.session.later) for r in in_flight if r.item is not None and r.item.session is not None
        )
        self.thinking.clear()
        cancelled = dict(self.in_flight)
        self.in_flight.clear()
        self.pacing.sending_done = True
        return cancelled
