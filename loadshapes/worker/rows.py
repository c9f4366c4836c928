"""The bookkeeping side of a load worker: every planned request ends as exactly one trace row, built from what
the wire client stamped, converted to Arrow in small steps between sends and written to Parquet on a pool
thread."""

from __future__ import annotations

import collections
import gc
import os
import threading
from collections.abc import Generator, Sequence
from typing import Any

import gevent
import gevent.event
import pyarrow as pa
from geventhttpclient._parser import HTTPParseError

from loadshapes.http_framing import decode_response
from loadshapes.plan import Planned, WorkerPlan
from loadshapes.sse import (
    StreamError,
    StreamResult,
    body_lines,
    cancelled_message,
    latency_columns,
    spec_totals,
    telemetry_columns,
)
from loadshapes.trace import STEP_LIST_COLUMNS, PartWriter, rows_to_table_in_steps, step_summaries, writer_id
from loadshapes.worker.progress import Progress
from loadshapes.worker.sending import Pacing, Received, first_phase
from timebase.clock import now_ns

# Below this no step is assumed to fit before a send: Python's timing of a fast step is noisy.
_MIN_STEP_COST_NS = 150_000
_BACKLOG = 512
# The cyclic GC is off while sending: the worker's objects die by reference counting (a 10,881-request run left
# no cyclic garbage), and a pass over a Locust process takes 10-100 ms. Should this many young objects stay
# alive anyway, a young-generation pass runs as a bookkeeping step.
_GC_LIVE_YOUNG_OBJECTS = 100_000


class RowKeeper:
    """Trace rows: built from received responses, buffered, converted and written."""

    def __init__(self, plan: WorkerPlan, pacing: Pacing, progress: Progress) -> None:
        self.plan = plan
        self.pacing = pacing
        self.progress = progress
        self.writer = PartWriter(
            plan.trace_root, writer_id=writer_id(plan.arm, plan.shape_name, plan.repeat, plan.worker)
        )
        self.rows: list[dict[str, Any]] = []
        self.to_convert: collections.deque[list[dict[str, Any]]] = collections.deque()
        self.converting: Generator[str, None, pa.Table] | None = None
        self.writes: list[gevent.event.AsyncResult] = []
        self.received: collections.deque[Received] = collections.deque()  # answered, row not yet built
        self.work_ready = gevent.event.Event()
        self.step_cost_ns = dict.fromkeys(("row", "slice", "assemble"), _MIN_STEP_COST_NS)
        self.step_cost_ns["gc"] = 50_000_000  # until measured: a young-generation pass can take tens of ms
        self.convert_next = "slice"  # the next conversion step: a column slice, or the table's assembly
        self.bookkeeper: gevent.Greenlet | None = None

    def receive(self, received: Received) -> None:
        """An answered (or failed) request, from the event loop: its row is built by the bookkeeping loop."""
        self.received.append(received)
        self.work_ready.set()

    def base_row(self, index: int, scheduled_ns: int, item: Planned | None) -> dict[str, Any]:
        plan = self.plan
        start_ns = self.pacing.start_ns
        return {
            "prompt_sha256": item.prompt_sha256 if item else None,
            "prompt": item.spec.prompt if item and plan.store_prompts else None,
            "campaign": plan.campaign,
            "run": plan.run,
            "arm": plan.arm,
            "policy": plan.policy,
            "topology": plan.topology,
            "shape": plan.shape_name,
            "phase": item.phase if item else first_phase(plan),
            "worker": plan.worker,
            "request_id": plan.request_id(index),
            "repeat": plan.repeat,
            "request_index": index,
            "category": item.spec.category if item else None,
            "session_id": item.session.session_id if item and item.session else None,
            "turn": item.session.turn if item and item.session else None,
            "scheduled_ns": scheduled_ns,
            "unit_start_ns": start_ns,
            # Open loop: the planned offset itself; closed loop: when the user sent it.
            "offset_s": item.offset_s
            if item and plan.shape.open_loop
            else (None if start_ns is None else (scheduled_ns - start_ns) / 1e9),
            "offered_rate_rps": item.offered_rate_rps if item and plan.shape.open_loop else None,
        }

    def record(self, row: dict[str, Any]) -> None:
        self.progress.count(row)
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
        while not self.pacing.finished:
            gevent.sleep(self.plan.flush_s)
            self.flush()

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
        result = StreamResult(speculation=self.plan.target.speculation)
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
        self.progress.report_to_locust(received.sent_ns or received.scheduled_ns, done_ns, error_message)
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
        row.update(spec_totals(result))
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
                if self.pacing.finished:
                    return
                self.work_ready.clear()
                self.work_ready.wait(timeout=0.05)
                continue
            room_ns = self.pacing.next_due_ns - now_ns()
            paced = self.plan.shape.open_loop and not self.pacing.sending_done  # closed loop: no send times
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

    def start(self) -> None:
        self.bookkeeper = gevent.spawn(self.bookkeeping)

    def join(self) -> None:
        """At the stop: the bookkeeping loop ends its step and leaves the rest to `finish_everything`."""
        if self.bookkeeper is not None and self.bookkeeper is not gevent.getcurrent():
            self.work_ready.set()
            self.bookkeeper.join()

    def cancel(self, received: Received, stop_ns: int) -> None:
        """A `cancelled` row for a request still in flight when the worker stopped."""
        scheduled_ns = received.scheduled_ns
        row = self.base_row(received.index, scheduled_ns, received.item)
        waited = (stop_ns - scheduled_ns) / 1e9
        row.update(
            sent_ns=received.sent_ns,
            send_lateness_ns=_lateness(received),
            done_ns=stop_ns,
            status="cancelled",
            error_class="drain_timeout",
            error_message=cancelled_message(waited),
        )
        self.rows.append(row)

    def not_sent(self, items: Sequence[Planned], stop_ns: int) -> None:
        """A `cancelled` row for each planned request the worker stopped before sending."""
        for item in items:
            scheduled = (self.pacing.start_ns or stop_ns) + round(item.offset_s * 1e9)
            row = self.base_row(item.index, scheduled, item)
            row.update(
                status="cancelled", error_class="not_sent", error_message="the worker stopped before its send time"
            )
            self.rows.append(row)

    def finish_everything(self) -> None:
        """At the stop, unpaced: every received response becomes a row, every row reaches a file."""
        while self.received:
            self.finish_safely(self.received.popleft())
        self.flush()
        while self.converting is not None or self.to_convert:
            self.convert_step()
        for write in self.writes:
            write.get()  # a failed write raises here, before the summary claims the rows are on disk


def _write_in_background(writer: PartWriter, plan: WorkerPlan, table: pa.Table) -> None:
    """Parquet encoding and the file write, on a pool thread at the lowest CPU priority: on a busy core the
    sender's wake-ups come first. It is C++ that releases the GIL, so this thread never holds the sender up."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    writer.write_table(plan.arm, plan.shape_name, table)


def _lateness(received: Received) -> int | None:
    return None if received.dispatched_ns is None else received.dispatched_ns - received.scheduled_ns


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
