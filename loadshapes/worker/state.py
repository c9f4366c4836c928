"""One load worker process: its plan (from the environment), its three parts (sending.py, rows.py, progress.py)
and the stop that ends them together."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
from pathlib import Path

import gevent
import yaml
from locust.env import Environment

from loadshapes.plan import WorkerPlan
from loadshapes.worker.progress import Progress
from loadshapes.worker.rows import RowKeeper
from loadshapes.worker.sending import Pacing, Sender
from timebase.clock import now_ns


def load_plan() -> WorkerPlan:
    path = os.environ.get("SPECDRILL_LOAD_PLAN")
    if not path:
        sys.exit("SPECDRILL_LOAD_PLAN is not set: point it at a load plan (YAML or JSON, see docs/operator/traffic.md)")
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


def raise_priority_to_normal() -> tuple[int, int]:
    """A worker started at a lower priority (Ray's workers, a niced shell) sends late on a busy host: back to
    nice 0 where this process may (an unprivileged one may not lower its niceness below its RLIMIT_NICE).
    Returns the niceness before and after."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if before > 0:
        with contextlib.suppress(OSError):  # not permitted: the worker runs at `before`, and its summary says so
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    return before, os.getpriority(os.PRIO_PROCESS, 0)


class WorkerState:
    """Everything one worker process measures; every planned request ends as exactly one row."""

    def __init__(self, plan: WorkerPlan) -> None:
        self.plan = plan
        nice_before, nice_now = raise_priority_to_normal()
        self.pacing = Pacing(start_ns=plan.start_ns)
        self.progress = Progress(plan, niceness_at_start=nice_before, niceness=nice_now)
        self.rows = RowKeeper(plan, self.pacing, self.progress)
        self.sender = Sender(plan, self.pacing, on_answered=self.rows.receive)
        # The schedule is hundreds of thousands of long-lived objects: keep them out of the cyclic GC, whose
        # full passes over them would stall the sender for tens of milliseconds.
        gc.collect()
        gc.freeze()
        if plan.ready_file:
            Path(plan.ready_file).write_text(str(len(self.sender.schedule)), encoding="utf-8")

    def start(self, environment: Environment) -> None:
        """At Locust's test start: the periodic flush, the request timeouts, the bookkeeping and the progress."""
        self.progress.environment = environment
        gevent.spawn(self.rows.flush_periodically)
        gevent.spawn(self.sender.expire_periodically)
        self.rows.start()
        gevent.spawn(self.progress.report_periodically, self.sender)

    def stop(self) -> None:
        """Cancel what is still in flight (one `cancelled` row each), write every buffered row and the summary."""
        if self.pacing.finished:
            return
        self.pacing.finished = True
        cancelled = self.sender.close()
        self.rows.join()  # what was answered before the stop
        gc.enable()
        stop_ns = now_ns()
        for _, received in sorted(cancelled.items()):
            if received.answered is not None:
                received.answered.set()  # a closed-loop user waiting on it sees the stop
            self.rows.cancel(received, stop_ns)
        if self.plan.shape.open_loop:
            # The worker was stopped early (sessions' later turns are counted by the sender, not planned).
            planned_sent = self.sender.sent - self.sender.follow_ups_sent
            self.rows.not_sent(self.sender.schedule[planned_sent:], stop_ns)
        self.rows.finish_everything()
        if self.plan.summary_file:  # written last, atomically: its presence means every row is on disk
            temporary = Path(self.plan.summary_file + ".tmp")
            temporary.write_text(json.dumps(self.progress.summary(self.sender, self.rows.writer)), encoding="utf-8")
            temporary.rename(self.plan.summary_file)
