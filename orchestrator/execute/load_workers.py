"""Load workers: Locust processes driven by Ray actors spread over the cluster, all starting at one instant.

Locust monkey-patches the interpreter with gevent, which breaks Ray in the same process (see
shared notes), so each actor runs `locust -f loadshapes/locustfile.py --headless` as a child process and talks to
it through files: the plan, a ready file (the schedule is built), a go file (the common start time, written
once every worker is ready) and a summary. The child dies with the actor (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import loadshapes
from loadshapes.plan import WorkerPlan
from orchestrator.execute.interrupts import raise_pending
from orchestrator.logs import get_logger
from orchestrator.rundir.worker_summary import WorkerSummary
from timebase.clock import now_ns

log = get_logger(__name__)
LOCUSTFILE = Path(loadshapes.__file__).resolve().parent / "locustfile.py"  # run by path: a program, not an import


def _child_setup(cpu: int | None) -> Callable[[], None]:
    def setup() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphaned load when the actor is killed
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    return setup


def _locust(
    plan_path: Path, log_path: Path, env: dict[str, str] | None, cpu: int | None, wait_s: float = 0.0
) -> subprocess.Popen[bytes]:
    environment = {**os.environ, **(env or {}), "SPECDRILL_LOAD_PLAN": str(plan_path)}
    environment["SPECDRILL_PLAN_WAIT_S"] = str(wait_s)
    environment.pop("LOCUST_SKIP_MONKEY_PATCH", None)
    # No --host: the user classes take the plan's base URL, so a standby process needs no plan to start.
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "--loglevel", "WARNING", "--only-summary", "--stop-timeout", "5",
    ]  # fmt: skip
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=environment, preexec_fn=_child_setup(cpu)
        )


class Standby:
    """A Locust process started before its plan exists: it pays Locust's import (seconds) between units, then
    waits (at most `wait_s`) for the plan file. Adopted by the next LocustProcess with the same environment."""

    def __init__(self, workdir: str | None, env: dict[str, str] | None, *, wait_s: float = 3600.0) -> None:
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="specdrill-worker-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        tag = f"standby-{os.getpid()}-{time.monotonic_ns()}"
        self.plan_path, self.log_path = self.dir / f"{tag}.plan.json", self.dir / f"{tag}.log"
        self.env = env
        self.process = _locust(self.plan_path, self.log_path, env, None, wait_s)

    def usable(self, env: dict[str, str] | None) -> bool:
        return self.env == env and self.process.poll() is None

    def discard(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class LocustProcess:
    """One Locust child process running one plan; usable without Ray (tests, a single machine)."""

    def __init__(self, plan: WorkerPlan, workdir: str | None = None, *, cpu: int | None = None) -> None:
        self.cpu = cpu
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="specdrill-worker-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        tag = f"{plan.arm}-{plan.shape_name}-r{plan.repeat}-w{plan.worker}"
        files = {
            "ready_file": str(self.dir / f"{tag}.ready"),
            "summary_file": str(self.dir / f"{tag}.summary.json"),
            "progress_file": str(self.dir / f"{tag}.progress.json"),
        }
        if plan.start_ns is None:
            files["go_file"] = str(self.dir / f"{tag}.go")
        self.plan = plan.model_copy(update=files)
        self.plan_path = self.dir / f"{tag}.plan.json"
        self.plan_path.write_text(self.plan.model_dump_json(), encoding="utf-8")
        self.log_path = self.dir / f"{tag}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None, *, standby: Standby | None = None) -> None:
        if standby is not None and standby.usable(env):
            temporary = standby.plan_path.with_suffix(".tmp")
            temporary.write_text(self.plan.model_dump_json(), encoding="utf-8")
            temporary.rename(standby.plan_path)  # atomic: the waiting process never reads half a plan
            self.process, self.log_path = standby.process, standby.log_path
            return
        if standby is not None:
            standby.discard()
        self.process = _locust(self.plan_path, self.log_path, env, self.cpu)

    def wait_ready(self, timeout_s: float) -> int:
        assert self.plan.ready_file is not None
        ready = Path(self.plan.ready_file)
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"load worker exited before it was ready: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"load worker not ready within {timeout_s:.0f} s: {self.log_tail()}")
            time.sleep(0.02)
        return int(ready.read_text(encoding="utf-8") or 0)

    def go(self, start_ns: int) -> None:
        assert self.plan.go_file is not None
        temporary = Path(self.plan.go_file + ".tmp")
        temporary.write_text(str(start_ns), encoding="utf-8")
        temporary.rename(self.plan.go_file)  # atomic: the worker never reads half a number

    def wait(self, timeout_s: float) -> WorkerSummary:
        """The summary, as soon as the worker has written it (Locust's own shutdown, up to its next one-second
        shape tick, is not waited for); or, past `timeout_s`, after stopping it."""
        assert self.process is not None and self.plan.summary_file is not None
        summary = Path(self.plan.summary_file)
        deadline = time.monotonic() + timeout_s
        while not summary.exists() and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if summary.exists():
            return WorkerSummary.model_validate(json.loads(summary.read_text(encoding="utf-8")))
        try:
            code = self.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGINT)  # Locust's quit path writes every row and the summary
            try:
                code = self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                code = self.process.wait()
        if not summary.exists():
            raise RuntimeError(f"load worker exited with {code} and no summary: {self.log_tail()}")
        return WorkerSummary.model_validate({**json.loads(summary.read_text(encoding="utf-8")), "exit_code": code})

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def progress(self) -> dict[str, Any] | None:
        assert self.plan.progress_file is not None
        try:
            data: dict[str, Any] = json.loads(Path(self.plan.progress_file).read_text(encoding="utf-8"))
            return data
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])


class LiveMetrics:
    """The worker's progress counters as Ray metrics (the metrics export port; Ray's dashboard and Prometheus):
    in flight, completions by status, goodput and executed k over the last second, tagged by arm and shape."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge

        tags = ("arm", "shape", "worker")
        self.in_flight = Gauge("specdrill_load_in_flight", "requests sent and not finished", tag_keys=tags)
        self.completions = Counter(
            "specdrill_load_completions", "finished requests by status", tag_keys=(*tags, "status")
        )
        self.goodput = Gauge("specdrill_load_goodput", "requests per second meeting the SLO", tag_keys=tags)
        self.executed_k = Gauge("specdrill_load_executed_k", "mean executed k of finished requests", tag_keys=tags)
        self.last: dict[str, Any] | None = None

    def update(self, progress: dict[str, Any], tags: dict[str, str]) -> None:
        self.in_flight.set(progress["in_flight"], tags=tags)
        last = self.last or {"statuses": {}, "good": 0, "k_sum": 0, "k_steps": 0, "t_ns": progress["t_ns"] - 10**9}
        for status, count in progress["statuses"].items():
            delta = count - last["statuses"].get(status, 0)
            if delta > 0:
                self.completions.inc(delta, tags={**tags, "status": status})
        seconds = max((progress["t_ns"] - last["t_ns"]) / 1e9, 1e-3)
        self.goodput.set((progress["good"] - last["good"]) / seconds, tags=tags)
        steps = progress["k_steps"] - last["k_steps"]
        if steps > 0:
            self.executed_k.set((progress["k_sum"] - last["k_sum"]) / steps, tags=tags)
        self.last = progress


class LoadWorker:
    """A Ray actor that runs one LocustProcess per unit (`ray.remote(LoadWorker)`; see `LoadWorkers`). It lives
    for the whole campaign: a fresh Ray worker process per unit would cost seconds of start-up each time."""

    def __init__(self, workdir: str | None = None) -> None:
        self.workdir = workdir
        self.process: LocustProcess | None = None
        self.standby: Standby | None = None
        self.tags: dict[str, str] = {}
        self.metrics: LiveMetrics | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._publisher = threading.Thread(target=self._publish, daemon=True)
        self._publisher.start()

    def _publish(self) -> None:
        self.metrics = LiveMetrics()
        while not self._stop.wait(1.0):
            with self._lock:
                process, tags = self.process, self.tags
            progress = process.progress() if process is not None else None
            if progress is not None and progress != self.metrics.last:
                self.metrics.update(progress, tags)

    def start(self, plan_json: str, env: dict[str, str] | None = None) -> None:
        plan = WorkerPlan.model_validate_json(plan_json)
        if self.process is not None:
            self.process.stop()
        process = LocustProcess(plan, self.workdir)
        process.start(env, standby=self.standby)
        self.standby = None
        with self._lock:
            self.process = process
            self.tags = {"arm": plan.arm, "shape": plan.shape_name, "worker": str(plan.worker)}
            if self.metrics is not None:
                self.metrics.last = None  # counters start again with the unit

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def _current(self) -> LocustProcess:
        if self.process is None:
            raise RuntimeError("no plan started on this load worker")
        return self.process

    def wait_ready(self, timeout_s: float) -> int:
        return self._current().wait_ready(timeout_s)

    def progress(self) -> dict[str, Any] | None:
        return self.process.progress() if self.process is not None else None

    def go(self, start_ns: int) -> None:
        self._current().go(start_ns)

    def wait(self, timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
        summary = self._current().wait(timeout_s)
        # The next unit's Locust starts now, between units, so its start-up is off the next unit's clock.
        self.standby = Standby(self.workdir, env)
        return summary.model_copy(update={"node_id": self.node_id()}).model_dump()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        if self.standby is not None:
            self.standby.discard()
            self.standby = None


def actor_name(plan: WorkerPlan, generation: int = 0) -> str:
    """One actor per worker slot of a run; a slot whose actor died gets a new one, of the next generation."""
    return f"specdrill-load-{plan.campaign}-{plan.run}-w{plan.worker}-g{generation}"


class LoadWorkers:
    """The campaign's load worker actors, spread over the nodes (SPREAD), reused unit after unit.

    A worker that dies mid-run (its node, its actor killed) does not stop the others: it comes back as a
    summary with `lost=True`; the rows it had flushed stay in the trace, the rest is the unit's gap. The next
    unit gets a new actor in its place."""

    def __init__(self, *, cpus_per_worker: float = 1.0, workdir: str | None = None) -> None:
        self.cpus_per_worker = cpus_per_worker
        self.workdir = workdir
        self.actors: dict[int, Any] = {}
        self.generations: dict[int, int] = {}
        self.nodes: dict[int, str] = {}  # worker slot -> the node its actor runs on (actors do not move)

    def __enter__(self) -> LoadWorkers:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _actor(self, plan: WorkerPlan) -> Any:
        import ray

        if plan.worker not in self.actors:
            generation = self.generations.get(plan.worker, -1) + 1
            self.generations[plan.worker] = generation
            # max_concurrency: `progress` answers while `wait` blocks.
            self.actors[plan.worker] = (
                ray.remote(LoadWorker)
                .options(
                    name=actor_name(plan, generation), num_cpus=self.cpus_per_worker, scheduling_strategy="SPREAD",
                    max_concurrency=4,
                )
                .remote(self.workdir)
            )  # fmt: skip
        return self.actors[plan.worker]

    def run(
        self,
        plans: Sequence[WorkerPlan],
        *,
        ready_timeout_s: float = 300.0,
        lead_s: float = 0.5,
        env: dict[str, str] | None = None,
        routes: Mapping[str, str] | None = None,
    ) -> list[WorkerSummary]:
        """Run plans (one per worker) with one common start time. `routes`: {node id: the arm's URL through that
        node's proxy}; a worker on a node listed there sends to it, any other to its plan's URL."""
        import ray
        from ray.exceptions import RayActorError

        actors = [self._actor(plan) for plan in plans]
        if routes:
            plans = [routed(plan, routes.get(self._node(plan.worker))) for plan in plans]
        ray.get([a.start.remote(plan.model_dump_json(), env) for a, plan in zip(actors, plans, strict=True)])
        scheduled = ray.get([a.wait_ready.remote(ready_timeout_s) for a in actors])
        start = now_ns() + round(lead_s * 1e9)
        ray.get([a.go.remote(start) for a in actors])
        log.info("load started", workers=len(actors), start_ns=start)
        longest = max(p.shape.duration + p.drain_s for p in plans) + lead_s + 60
        pending = [a.wait.remote(longest, env) for a in actors]
        summaries: list[WorkerSummary] = []
        for plan, count, ref in zip(plans, scheduled, pending, strict=True):
            try:
                while not ray.wait([ref], timeout=1.0)[0]:
                    raise_pending()  # a stop Python swallowed (execute/interrupts.py) ends the wait within 1 s
                summaries.append(WorkerSummary.model_validate(ray.get(ref)))
            except RayActorError as exc:
                log.error("load worker lost", worker=plan.worker, arm=plan.arm, shape=plan.shape_name,
                          error=str(exc).splitlines()[0])  # fmt: skip
                summaries.append(lost_worker(plan, count, start, str(exc).splitlines()[0]))
                self.actors.pop(plan.worker, None)
                self.nodes.pop(plan.worker, None)
        return summaries

    def _node(self, worker: int) -> str:
        import ray

        if worker not in self.nodes:
            self.nodes[worker] = ray.get(self.actors[worker].node_id.remote())
        return self.nodes[worker]

    def close(self) -> None:
        import ray

        for actor in self.actors.values():
            ray.kill(actor)  # its Locust children (running or standby) die with it (PR_SET_PDEATHSIG)
        self.actors.clear()


def routed(plan: WorkerPlan, url: str | None) -> WorkerPlan:
    """The plan sending to `url` (None: as it is)."""
    if url is None or url == plan.target.base_url:
        return plan
    return plan.model_copy(update={"target": plan.target.model_copy(update={"base_url": url})})


def run_load(
    plans: Sequence[WorkerPlan],
    *,
    cpus_per_worker: float = 1.0,
    ready_timeout_s: float = 300.0,
    lead_s: float = 0.5,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
) -> list[WorkerSummary]:
    """One unit on workers of its own (tests, one-off runs); a campaign keeps one LoadWorkers for all units."""
    with LoadWorkers(cpus_per_worker=cpus_per_worker, workdir=workdir) as workers:
        return workers.run(plans, ready_timeout_s=ready_timeout_s, lead_s=lead_s, env=env)


def lost_worker(plan: WorkerPlan, scheduled: int, start_ns: int, reason: str) -> WorkerSummary:
    return WorkerSummary(
        worker=plan.worker, arm=plan.arm, shape=plan.shape_name, repeat=plan.repeat, scheduled=scheduled, sent=0,
        rows_written=0, files=[], start_ns=start_ns, lateness_p50_s=0.0, lateness_p99_s=0.0, lateness_max_s=0.0,
        saturated=False, max_in_flight=0, statuses={}, lost=True, lost_reason=reason,
    )  # fmt: skip
