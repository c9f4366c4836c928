"""The counting side of a load worker: rows by status, good requests, speculative steps, reported while it runs
(a progress file each second for the orchestrator, Locust's request event for its console) and at the end (the
summary)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent
import numpy as np
from locust.env import Environment

from loadshapes.plan import WorkerPlan
from timebase.clock import now_ns

if TYPE_CHECKING:
    from loadshapes.trace import PartWriter
    from loadshapes.worker.sending import Sender


class Progress:
    def __init__(self, plan: WorkerPlan, *, niceness_at_start: int = 0, niceness: int = 0) -> None:
        self.plan = plan
        self.niceness_at_start, self.niceness = niceness_at_start, niceness
        self.started_wall, self.started_cpu = time.monotonic(), time.process_time()
        self.statuses: dict[str, int] = {}
        self.good = 0
        self.k_sum = 0
        self.k_steps = 0
        self.environment: Environment | None = None  # Locust's, once the test starts

    def count(self, row: dict[str, Any]) -> None:
        self.statuses[row["status"]] = self.statuses.get(row["status"], 0) + 1
        if row["status"] == "ok":
            if self.plan.meets_slo(row["category"], row["ttft_s"], row["tpot_s"], row["e2e_s"]):
                self.good += 1
            if row.get("engine_steps"):
                self.k_sum += row["step_k_sum"] or 0
                self.k_steps += row["engine_steps"]

    def report_periodically(self, sender: Sender) -> None:
        if not self.plan.progress_file:
            return
        path = Path(self.plan.progress_file)
        while not sender.pacing.finished:
            gevent.sleep(1.0)
            counters = {
                "sent": sender.sent, "in_flight": len(sender.in_flight), "statuses": self.statuses,
                "good": self.good, "k_sum": self.k_sum, "k_steps": self.k_steps, "t_ns": now_ns(),
            }  # fmt: skip
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(counters), encoding="utf-8")
            temporary.replace(path)

    def report_to_locust(self, sent_ns: int, done_ns: int | None, error: str | None) -> None:
        """Locust's own statistics, for its console and web UI only: no result is computed from them."""
        if self.environment is None:
            return
        elapsed_ms = ((done_ns or now_ns()) - sent_ns) / 1e6
        self.environment.events.request.fire(  # type: ignore[no-untyped-call]
            request_type="POST", name=self.plan.target.path, response_time=elapsed_ms, response_length=0,
            exception=RuntimeError(error) if error else None, context={},
        )  # fmt: skip

    def summary(self, sender: Sender, writer: PartWriter) -> dict[str, Any]:
        plan = self.plan
        lateness = np.asarray(sender.lateness_ns, dtype=np.int64) / 1e9
        p50, p99, top = np.percentile(lateness, [50, 99, 100]) if lateness.size else (0.0, 0.0, 0.0)
        waits = np.asarray(sender.connection_wait_ns, dtype=np.int64) / 1e9
        wait_p99 = float(np.percentile(waits, 99)) if waits.size else 0.0
        # Saturated: the worker sent late, or its own connection cap held requests back. Waiting for a new
        # connection the server is slow to accept is the server's doing: it shows in latency, not here.
        saturated = float(p99) > plan.lateness_bound_s or sender.client.waited_at_cap > 0
        return {
            "worker": plan.worker,
            "arm": plan.arm,
            "shape": plan.shape_name,
            "repeat": plan.repeat,
            # Every row: the planned arrivals (open loop) and the sessions' later turns sent.
            "scheduled": len(sender.schedule) + sender.follow_ups_sent if plan.shape.open_loop else sender.sent,
            "sent": sender.sent,
            "rows_written": writer.rows_written,
            "files": writer.files,
            "start_ns": sender.pacing.start_ns,
            "lateness_p50_s": float(p50),
            "lateness_p99_s": float(p99),
            "lateness_max_s": float(top),
            "saturated": bool(saturated),
            "connection_wait_p99_s": wait_p99,
            "waited_at_connection_cap": sender.client.waited_at_cap,
            "max_in_flight": sender.max_in_flight_seen,
            "connections_opened": sender.client.opened,
            # The process's CPU time: Locust's start-up and the dispatcher's spin before each send included.
            "cpu_s": time.process_time(),
            # The share of one core the worker used from its plan's start to its summary: near 1, it was CPU-bound.
            "cpu_share": (time.process_time() - self.started_cpu) / max(time.monotonic() - self.started_wall, 1e-9),
            "niceness": self.niceness,  # what it ran at, after raising itself to 0 where it could
            "niceness_at_start": self.niceness_at_start,
            "statuses": self.statuses,
            "session_turns_sent": sender.follow_ups_sent,  # later turns of sessions (their first turns: scheduled)
            "session_turns_not_sent": sender.turns_not_sent.as_dict(),
        }
