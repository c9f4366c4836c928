"""The Locust side of a load worker: an open-loop (or closed-loop) OpenAI streaming client writing trace rows.

The orchestrator starts it in a subprocess of a Ray actor (orchestrator/load_workers.py); it also runs by hand:

    SPECDRILL_LOAD_PLAN=plan.yaml locust -f loadshapes/locustfile.py --headless

Open loop: one dispatcher user hands every planned request to the wire client (loadshapes/wire.py) at its
scheduled time, whether or not earlier ones have finished, so a stalled server shows in the latency of everything
scheduled during the stall (no coordinated omission). Latency counts from the scheduled time and send lateness
(dispatch minus scheduled: how late the worker itself was) is recorded.
Results come from the trace rows written here, never from Locust's statistics.

Import this only in a Locust process: Locust monkey-patches the interpreter with gevent.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import numpy as np
import pyarrow as pa
import yaml
from geventhttpclient._parser import HTTPParseError
from locust import LoadTestShape, User, events, task
from locust.env import Environment
from locust.exception import StopUser

from loadshapes.plan import Planned, WorkerPlan, closed_loop_users, open_loop_schedule, request_body
from loadshapes.sse import StreamError, StreamResult, body_lines, latency_columns, telemetry_columns
from loadshapes.trace import STEP_LIST_COLUMNS, PartWriter, rows_to_table_in_steps, step_summaries
from loadshapes.wire import Exchange, WireClient, decode_response, request_bytes, request_head
from timebase.clock import now_ns

# Below this no step is assumed to fit before a send: Python's timing of a fast step is noisy.
_MIN_STEP_COST_NS = 150_000
_BACKLOG = 512
# The cyclic GC is off while sending: the worker's objects die by reference counting (a 10,881-request run left
# no cyclic garbage), and a pass over a Locust process takes 10-100 ms. Should this many young objects stay
# alive anyway, a young-generation pass runs as a bookkeeping step.
_GC_LIVE_YOUNG_OBJECTS = 100_000


@dataclass(slots=True, kw_only=True)
class Received(Exchange):
    """One planned request on the wire and what came back (see wire.Exchange); the bookkeeping greenlet turns
    it into the trace row."""

    index: int
    item: Planned | None
    scheduled_ns: int
    answered: gevent.event.Event | None = None  # set when it ends (closed loop: the user waits for it)


def _load_plan() -> WorkerPlan:
    path = os.environ.get("SPECDRILL_LOAD_PLAN")
    if not path:
        sys.exit("SPECDRILL_LOAD_PLAN is not set: point it at a load plan (YAML or JSON, see README)")
    # A standby worker is started before its plan exists (Locust's import costs seconds): it waits here, bounded.
    wait_s = float(os.environ.get("SPECDRILL_PLAN_WAIT_S", "0"))
    deadline = time.monotonic() + wait_s
    while wait_s and not Path(path).exists():
        if time.monotonic() > deadline:
            sys.exit(f"no load plan at {path} within {wait_s:.0f} s")
        time.sleep(0.02)
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    return WorkerPlan.model_validate(data)


class WorkerState:
    """Everything one worker process measures; every planned request ends as exactly one row."""

    def __init__(self, plan: WorkerPlan) -> None:
        self.plan = plan
        self.schedule: list[Planned] = open_loop_schedule(plan) if plan.shape.open_loop else []
        self.writer = PartWriter(
            plan.trace_root, writer_id=f"{plan.arm}-{plan.shape_name}-r{plan.repeat}-w{plan.worker}"
        )
        self.rows: list[dict[str, Any]] = []
        self.to_convert: collections.deque[list[dict[str, Any]]] = collections.deque()
        self.converting: Generator[str, None, pa.Table] | None = None
        self.writes: list[gevent.event.AsyncResult] = []
        self.in_flight: dict[int, Received] = {}
        self.received: collections.deque[Received] = collections.deque()  # answered, row not yet built
        self.work_ready = gevent.event.Event()
        self.next_due_ns = 0  # the dispatcher's next send time: bookkeeping waits when it is near
        self.sending_done = False
        self.step_cost_ns = dict.fromkeys(("row", "slice", "assemble"), _MIN_STEP_COST_NS)
        self.step_cost_ns["gc"] = 50_000_000  # until measured: a young-generation pass can take tens of ms
        self.convert_next = "slice"  # the next conversion step: a column slice, or the table's assembly
        self.bookkeeper: gevent.Greenlet | None = None
        self.lateness_ns: list[int] = []  # dispatch minus scheduled: how late the worker itself was
        self.connection_wait_ns: list[int] = []  # send minus dispatch: waiting for a free or new connection
        self.start_ns: int | None = plan.start_ns
        self.end_ns: int | None = None
        self.finished = False
        self.sent = 0
        self.max_in_flight_seen = 0
        self.closed_loop_counter = 0
        self.statuses: dict[str, int] = {}
        self.good = 0
        self.k_sum = 0
        self.k_steps = 0
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}
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
        self.environment: Environment | None = None
        # The schedule is hundreds of thousands of long-lived objects: keep them out of the cyclic GC, whose
        # full passes over them would stall the sender for tens of milliseconds.
        gc.collect()
        gc.freeze()
        if plan.ready_file:
            Path(plan.ready_file).write_text(str(len(self.schedule)), encoding="utf-8")

    def wait_for_start(self) -> int:
        if self.start_ns is None:
            if self.plan.go_file:
                go = Path(self.plan.go_file)
                while not go.exists():
                    gevent.sleep(0.005)
                self.start_ns = int(go.read_text(encoding="utf-8"))
            else:
                self.start_ns = now_ns() + 500_000_000
        self.end_ns = self.start_ns + round(self.plan.shape.duration * 1e9)
        # From here the cyclic GC stays off (see _GC_LIVE_YOUNG_OBJECTS); what is alive now is frozen out of it.
        gc.collect()
        gc.freeze()
        gc.disable()
        return self.start_ns

    # --- rows -------------------------------------------------------------------------------------------------
    def base_row(self, index: int, scheduled_ns: int, item: Planned | None) -> dict[str, Any]:
        plan = self.plan
        return {
            "prompt_sha256": item.prompt_sha256 if item else None,
            "prompt": item.spec.prompt if item and plan.store_prompts else None,
            "campaign": plan.campaign,
            "run": plan.run,
            "arm": plan.arm,
            "policy": plan.policy,
            "topology": plan.topology,
            "shape": plan.shape_name,
            "phase": item.phase if item else self.closed_loop_phase(),
            "worker": plan.worker,
            "request_id": plan.request_id(index),
            "repeat": plan.repeat,
            "request_index": index,
            "category": item.spec.category if item else None,
            "scheduled_ns": scheduled_ns,
            "unit_start_ns": self.start_ns,
            # Open loop: the planned offset itself; closed loop: when the user sent it.
            "offset_s": item.offset_s
            if item and plan.shape.open_loop
            else (None if self.start_ns is None else (scheduled_ns - self.start_ns) / 1e9),
            "offered_rate_rps": item.offered_rate_rps if item and plan.shape.open_loop else None,
        }

    def record(self, row: dict[str, Any]) -> None:
        self.statuses[row["status"]] = self.statuses.get(row["status"], 0) + 1
        if row["status"] == "ok":
            if self.plan.meets_slo(row["category"], row["ttft_s"], row["tpot_s"], row["e2e_s"]):
                self.good += 1
            if row.get("engine_steps"):
                self.k_sum += row["step_k_sum"] or 0
                self.k_steps += row["engine_steps"]
        if not self.plan.write_trace:
            return
        self.rows.append(row)
        if len(self.rows) >= self.plan.flush_rows:
            self.flush()

    def flush(self) -> None:
        """Queue the buffered rows for conversion; the bookkeeping loop converts them in the gaps between sends
        and a pool thread encodes and writes the Parquet file (C++, without the GIL)."""
        rows, self.rows = self.rows, []
        if rows:
            self.to_convert.append(rows)
            self.work_ready.set()

    def write_converted(self, table: pa.Table) -> None:
        self.writes.append(gevent.get_hub().threadpool.spawn(_write_in_background, self.writer, self.plan, table))

    def flush_periodically(self) -> None:
        while not self.finished:
            gevent.sleep(self.plan.flush_s)
            self.flush()

    def report_progress(self) -> None:
        if not self.plan.progress_file:
            return
        path = Path(self.plan.progress_file)
        while not self.finished:
            gevent.sleep(1.0)
            counters = {
                "sent": self.sent, "in_flight": len(self.in_flight), "statuses": self.statuses, "good": self.good,
                "k_sum": self.k_sum, "k_steps": self.k_steps, "t_ns": now_ns(),
            }  # fmt: skip
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(counters), encoding="utf-8")
            temporary.replace(path)

    # --- one request ------------------------------------------------------------------------------------------
    # Split in two so that sending keeps priority over bookkeeping on the worker's one core: the wire client
    # writes each request as it is due and stamps every socket read from the event loop (loadshapes/wire.py);
    # `finish`, a step of the one `bookkeeping` greenlet, decodes the response and builds the trace row in the
    # gaps between scheduled sends.
    def submit(
        self, index: int, item: Planned | None, scheduled_ns: int, answered: gevent.event.Event | None = None
    ) -> None:
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

    def answered(self, exchange: Exchange) -> None:
        """From the event loop, once per request: queue it for its row."""
        assert isinstance(exchange, Received)
        if self.in_flight.pop(exchange.index, None) is None:
            return  # already written as cancelled
        if exchange.sent_ns is not None and exchange.dispatched_ns is not None:
            self.connection_wait_ns.append(exchange.sent_ns - exchange.dispatched_ns)
        self.received.append(exchange)
        self.work_ready.set()
        if exchange.answered is not None:
            exchange.answered.set()

    def send_and_wait(self, index: int, item: Planned, scheduled_ns: int) -> None:
        """Closed loop: the next request only once this one has ended."""
        answered = gevent.event.Event()  # set by `answered`, or by the stop
        self.submit(index, item, scheduled_ns, answered)
        answered.wait()

    def expire_periodically(self) -> None:
        interval = min(0.1, self.plan.request_timeout_s / 10)
        while not self.finished:
            gevent.sleep(interval)
            if not self.finished:
                self.client.expire()

    def wait_drained(self, timeout_s: float) -> None:
        deadline = now_ns() + round(timeout_s * 1e9)
        while self.in_flight and now_ns() < deadline:
            gevent.sleep(0.01)

    def finish_safely(self, received: Received) -> None:
        """A response the worker cannot turn into a row (a bug, an unforeseen payload) still gets one."""
        try:
            self.finish(received)
        except Exception as exc:
            row = self.base_row(received.index, received.scheduled_ns, received.item)
            row.update(
                sent_ns=received.sent_ns,
                done_ns=received.done_ns or received.failed_ns or now_ns(),
                send_lateness_ns=_lateness(received),
                status="error",
                error_class="worker_error",
                error_message=_short(f"{type(exc).__name__}: {exc}"),
            )
            self.record(row)

    def finish(self, received: Received) -> None:
        """The trace row of one answered (or failed) request, from what the wire client stamped."""
        result = StreamResult()
        failure: tuple[str, str, str] | None = None
        done_ns: int | None = None
        ended_ns: int | None = None
        try:
            try:
                response = decode_response(received.chunks, received.times)
            except HTTPParseError as exc:
                raise StreamError("connection_error", f"HTTPParseError: {exc}") from None
            if response is not None and response.status != 200:
                text = b"".join(response.body).decode("utf-8", "replace")
                raise StreamError(f"http_{response.status}", f"HTTP {response.status}: {_short(text)}")
            for line, t_ns in body_lines(response.body, response.times) if response else ():
                ended_ns = t_ns  # should this line break the protocol, that is when the request failed
                result.feed(line, t_ns)
            ended_ns = received.failed_ns
            if received.broken is not None:
                kind, message = received.broken
                raise StreamError("truncated_stream", f"{kind} after {len(result.token_times_ns)} tokens: {message}")
            if received.failure is not None:
                failure = received.failure
            else:
                done_ns = received.done_ns  # the whole body arrived; it may still lack [DONE] or usage
                result.check_complete()
        except StreamError as exc:
            failure = ("error", exc.kind, str(exc))
        status, error_class, error_message = failure or ("ok", None, None)
        ended_ns = done_ns if done_ns is not None else (ended_ns or now_ns())
        self.report_to_locust(received.sent_ns or received.scheduled_ns, done_ns, error_message)
        row = self.base_row(received.index, received.scheduled_ns, received.item)
        if result.prompt_tokens is None and received.item is not None:
            result.prompt_tokens = received.item.spec.prompt_tokens  # what was asked for, when the server did not say
        row.update(
            sent_ns=received.sent_ns,
            done_ns=ended_ns,
            send_lateness_ns=_lateness(received),
            prompt_tokens=result.prompt_tokens,
            output_tokens=result.output_tokens,
            token_times_ns=result.token_times_ns if self.plan.store_token_times else None,
            status=status,
            error_class=error_class,
            error_message=error_message,
            **latency_columns(received.scheduled_ns, result, done_ns),
            **telemetry_columns(result),
        )
        row.update(step_summaries(*(row[name] for name in STEP_LIST_COLUMNS)))
        if not self.plan.store_step_lists:
            row.update(dict.fromkeys(STEP_LIST_COLUMNS))
        self.record(row)

    def bookkeeping(self) -> None:
        """Rows from received responses, their conversion to Arrow and the garbage collector, in small steps
        taken only where they cannot delay the next send.

        Each step costs from tens of microseconds (an Arrow slice) to a fraction of a millisecond (a row) of
        Python, holding the worker's one core; done inline, a burst of them just before a send time would hold
        the send up by their sum. Here each step first checks the dispatcher's next due time against what a
        step of its kind has cost so far. A backlog past `_BACKLOG` rows is worked off regardless, so memory
        stays bounded when the worker is saturated (the lateness then says so).
        """
        while True:
            step = self.next_step()
            if step is None:
                if self.finished:
                    return
                self.work_ready.clear()
                self.work_ready.wait(timeout=0.05)
                continue
            room_ns = self.next_due_ns - now_ns()
            paced = self.plan.shape.open_loop and not self.sending_done  # closed loop: no send times to protect
            if paced and room_ns < self.step_cost_ns[step] and len(self.received) < _BACKLOG:
                gevent.sleep(max(room_ns, 0) / 1e9 + 0.00005)  # the send goes first
                continue
            self.take_step(step)

    def next_step(self) -> str | None:
        if self.received:
            return "row"
        if self.converting is not None or self.to_convert:
            return self.convert_next
        if gc.get_count()[0] >= _GC_LIVE_YOUNG_OBJECTS:
            return "gc"
        return None

    def take_step(self, step: str) -> None:
        started = now_ns()
        if step == "row":
            self.finish_safely(self.received.popleft())
        elif step in ("slice", "assemble"):
            self.convert_step()
        else:
            gc.collect(1)  # young generations only: a full pass waits for the stop
        cost = now_ns() - started
        # A cautious running estimate of what a step of this kind costs: up at once to a slower step (at most 4x,
        # so one step stalled by the OS does not close every gap for long), down by 2% a step.
        estimate = self.step_cost_ns[step]
        self.step_cost_ns[step] = max(min(cost, 4 * estimate), estimate * 98 // 100, _MIN_STEP_COST_NS)

    def convert_step(self) -> None:
        if self.converting is None:
            self.converting = rows_to_table_in_steps(self.to_convert.popleft())
        try:
            self.convert_next = next(self.converting)
        except StopIteration as done:
            self.converting = None
            self.convert_next = "slice"
            self.write_converted(done.value)

    def finish_everything(self) -> None:
        """At the stop, unpaced: every received response becomes a row, every row reaches a file."""
        while self.received:
            self.finish_safely(self.received.popleft())
        self.flush()
        while self.converting is not None or self.to_convert:
            self.convert_step()
        for write in self.writes:
            write.get()  # a failed write raises here, before the summary claims the rows are on disk

    def report_to_locust(self, sent_ns: int, done_ns: int | None, error: str | None) -> None:
        """Locust's own statistics, for its console and web UI only: no result is computed from them."""
        if self.environment is None:
            return
        elapsed_ms = ((done_ns or now_ns()) - sent_ns) / 1e6
        self.environment.events.request.fire(  # type: ignore[no-untyped-call]
            request_type="POST", name=self.plan.target.path, response_time=elapsed_ms, response_length=0,
            exception=RuntimeError(error) if error else None, context={},
        )  # fmt: skip

    def closed_loop_phase(self) -> str:
        return self.plan.shape.phases()[0].name

    # --- stop -------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel what is still in flight (one `cancelled` row each), write every buffered row and the summary."""
        if self.finished:
            return
        self.finished = True
        self.client.close()  # no callback comes after this: what is in flight is cancelled below
        cancelled = dict(self.in_flight)
        self.in_flight.clear()
        self.sending_done = True
        # What was answered before the stop: the bookkeeping loop ends its step and leaves the rest to us.
        if self.bookkeeper is not None and self.bookkeeper is not gevent.getcurrent():
            self.work_ready.set()
            self.bookkeeper.join()
        gc.enable()
        stop_ns = now_ns()
        for index, received in sorted(cancelled.items()):
            scheduled_ns = received.scheduled_ns
            row = self.base_row(index, scheduled_ns, received.item)
            waited = (stop_ns - scheduled_ns) / 1e9
            if received.answered is not None:
                received.answered.set()  # a closed-loop user waiting on it sees the stop
            row.update(
                sent_ns=received.sent_ns,
                send_lateness_ns=_lateness(received),
                done_ns=stop_ns,
                status="cancelled",
                error_class="drain_timeout",
                error_message=f"still in flight {waited:.1f} s after its scheduled send when the worker stopped",
            )
            self.rows.append(row)
        if self.plan.shape.open_loop:
            for item in self.schedule[self.sent :]:  # never sent (the worker was stopped early)
                scheduled = (self.start_ns or stop_ns) + round(item.offset_s * 1e9)
                row = self.base_row(item.index, scheduled, item)
                row.update(
                    status="cancelled", error_class="not_sent", error_message="the worker stopped before its send time"
                )
                self.rows.append(row)
        self.finish_everything()
        if self.plan.summary_file:  # written last, atomically: its presence means every row is on disk
            temporary = Path(self.plan.summary_file + ".tmp")
            temporary.write_text(json.dumps(self.summary()), encoding="utf-8")
            temporary.rename(self.plan.summary_file)

    def summary(self) -> dict[str, Any]:
        lateness = np.asarray(self.lateness_ns, dtype=np.int64) / 1e9
        p50, p99, top = np.percentile(lateness, [50, 99, 100]) if lateness.size else (0.0, 0.0, 0.0)
        waits = np.asarray(self.connection_wait_ns, dtype=np.int64) / 1e9
        wait_p99 = float(np.percentile(waits, 99)) if waits.size else 0.0
        # Saturated: the worker sent late, or its own connection cap held requests back. Waiting for a new
        # connection the server is slow to accept is the server's doing: it shows in latency, not here.
        saturated = float(p99) > self.plan.lateness_bound_s or self.client.waited_at_cap > 0
        return {
            "worker": self.plan.worker,
            "arm": self.plan.arm,
            "shape": self.plan.shape_name,
            "repeat": self.plan.repeat,
            "scheduled": len(self.schedule) if self.plan.shape.open_loop else self.sent,
            "sent": self.sent,
            "rows_written": self.writer.rows_written,
            "files": self.writer.files,
            "start_ns": self.start_ns,
            "lateness_p50_s": float(p50),
            "lateness_p99_s": float(p99),
            "lateness_max_s": float(top),
            "saturated": bool(saturated),
            "connection_wait_p99_s": wait_p99,
            "waited_at_connection_cap": self.client.waited_at_cap,
            "max_in_flight": self.max_in_flight_seen,
            "connections_opened": self.client.opened,
            # The process's CPU time: Locust's start-up and the dispatcher's spin before each send included.
            "cpu_s": time.process_time(),
            "statuses": self.statuses,
        }


def _write_in_background(writer: PartWriter, plan: WorkerPlan, table: pa.Table) -> None:
    """Parquet encoding and the file write, on a pool thread at the lowest CPU priority: on a busy core the
    sender's wake-ups come first. It is C++ that releases the GIL, so this thread never holds the sender up."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    writer.write_table(plan.arm, plan.shape_name, table)


def _lateness(received: Received) -> int | None:
    return None if received.dispatched_ns is None else received.dispatched_ns - received.scheduled_ns


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# Parquet rows are encoded on a worker thread; with the default 5 ms GIL switch interval that thread would hold
# the sender up to 5 ms at a time. 0.2 ms keeps send lateness well under a millisecond.
sys.setswitchinterval(0.0002)
PLAN = _load_plan()
STATE = WorkerState(PLAN)


class _SpecdrillUser(User):
    """Locust manages these users; their HTTP goes through the worker's one wire client (loadshapes/wire.py), not
    FastHttpUser's: the worker needs every microsecond for send accuracy."""

    abstract = True
    host = PLAN.target.base_url


class OpenLoopDispatcher(_SpecdrillUser):
    """Sends the plan's schedule: each request at its time, whatever is still in flight."""

    fixed_count = 1

    @task
    def dispatch(self) -> None:
        state = STATE
        start = state.wait_for_start()
        spin_ns = round(PLAN.spin_s * 1e9)
        for item in state.schedule:
            if state.finished:
                return
            due = start + round(item.offset_s * 1e9)
            state.next_due_ns = due
            delay = due - now_ns()
            if delay > spin_ns:
                gevent.sleep((delay - spin_ns) / 1e9)
            while now_ns() < due:
                gevent.sleep(0)  # poll the loop (other greenlets run) for sub-millisecond send accuracy
            state.submit(item.index, item, due)
        state.sending_done = True
        state.wait_drained(PLAN.drain_s)
        state.stop()
        # Done: leave now, so Locust's stop does not wait out its stop timeout for a user that never ends.
        raise StopUser


class ClosedLoopUser(_SpecdrillUser):
    """CLOSED LOOP: sends its next request as soon as the previous one ends, until the shape's duration."""

    @task
    def loop(self) -> None:
        state = STATE
        state.wait_for_start()
        assert state.end_ns is not None
        while now_ns() < state.end_ns and not state.finished:
            index = PLAN.worker + PLAN.workers * state.closed_loop_counter
            state.closed_loop_counter += 1
            spec = PLAN.mix.at([index], seed=PLAN.traffic_seed("requests"))[0]
            item = Planned(index, 0.0, state.closed_loop_phase(), spec, request_body(PLAN, spec))
            state.send_and_wait(index, item, now_ns())
        raise StopUser  # the shape stops the run once nothing is in flight


class PlanShape(LoadTestShape):
    """Locust's view of the plan: one dispatcher for an open-loop shape (the arrival times are in the plan),
    this worker's share of the users for a closed-loop one. Ends the run when the plan is done."""

    def tick(self) -> tuple[int, float, list[type[User]] | None] | None:
        state = STATE
        if state.finished:
            return None
        if PLAN.shape.open_loop:
            return 1, 1.0, [OpenLoopDispatcher]
        users = closed_loop_users(PLAN)
        if users == 0:
            state.stop()
            return None
        if state.end_ns is not None and now_ns() >= state.end_ns + round(PLAN.drain_s * 1e9):
            state.stop()
            return None
        if state.end_ns is not None and now_ns() >= state.end_ns and not state.in_flight:
            state.stop()
            return None
        return users, float(users), [ClosedLoopUser]


@events.test_start.add_listener  # type: ignore[untyped-decorator]
def _start_flusher(environment: Environment, **_: Any) -> None:
    STATE.environment = environment
    gevent.spawn(STATE.flush_periodically)
    gevent.spawn(STATE.expire_periodically)
    STATE.bookkeeper = gevent.spawn(STATE.bookkeeping)
    gevent.spawn(STATE.report_progress)


@events.quitting.add_listener  # type: ignore[untyped-decorator]
def _write_everything(**_: Any) -> None:
    STATE.stop()
