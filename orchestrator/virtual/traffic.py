"""The traffic of a unit played into an arm's simulated engines: the requests the load workers would send (the
same plans, the same `open_loop_schedule`, so request ids, offsets, phases and prompts match), open loop at their
offsets or closed loop user by user, each to its engine round-robin."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadshapes.mixes import RequestSpec
from loadshapes.plan import Planned, WorkerPlan, open_loop_schedule
from orchestrator.plan.campaign import Campaign
from orchestrator.rundir.layout import Unit
from orchestrator.rundir.manifest import plans_for
from orchestrator.virtual.twins import ArmModel
from serve_apps.arms import ArmSpec
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.request import RequestRecord, SimRequest
from serve_apps.sim.virtual import run_closed_loop, run_open_loop

SPEC_BATCH = 64  # closed-loop requests built at a time
ERROR_RESPONSE_S = 0.001  # how long a refused request takes to come back (a closed-loop user then sends again)


@dataclass(slots=True)
class Sent:
    """One scheduled request: what was sent, when (seconds after the unit's start), and to which engine."""

    index: int
    request_id: str
    worker: int
    at_s: float
    phase: str
    spec: RequestSpec
    prompt_sha256: str
    rank: int
    request: SimRequest | None  # None: refused before it reached the engine (see `error`)
    error: str | None = None


@dataclass
class UnitRun:
    sent: list[Sent]
    records: dict[str, RequestRecord]  # finished requests by request id
    stops: dict[int, float]  # worker -> when it stopped and cancelled what was in flight (seconds after start)
    cores: list[EngineCore] = field(default_factory=list)

    @property
    def stop_s(self) -> float:
        return max(self.stops.values(), default=0.0)


class Traffic:
    """The requests of one (shape, repeat). They depend on the seed, shape and repeat only (loadshapes.plan), so
    they are built once from any arm's plans and played to every arm: building prompts costs more than
    simulating the engine."""

    def __init__(self, plans: Sequence[WorkerPlan]) -> None:
        self.plans = list(plans)
        self._schedule: list[tuple[Planned, int]] | None = None
        self._specs: dict[int, tuple[RequestSpec, str]] = {}

    def schedule(self) -> list[tuple[Planned, int]]:
        """Each worker's open_loop_schedule, merged back into the shape's arrivals: (request, worker)."""
        if self._schedule is None:
            merged = [(item, plan.worker) for plan in self.plans for item in open_loop_schedule(plan)]
            self._schedule = sorted(merged, key=lambda pair: pair[0].index)
        return self._schedule

    def spec(self, index: int) -> tuple[RequestSpec, str]:
        """Closed-loop request `index` (as the load worker builds it) and its prompt's sha256."""
        if index not in self._specs:
            # Request i is the same whichever batch builds it (RequestMix.at); a batch saves the per-call setup.
            plan = self.plans[0]
            batch = range(index, index + SPEC_BATCH)
            for i, spec in zip(batch, plan.mix.at(batch, seed=plan.traffic_seed("requests")), strict=True):
                self._specs[i] = (spec, hashlib.sha256(spec.prompt.encode()).hexdigest())
        return self._specs[index]


def _refusal(model: ArmModel, core: EngineCore, spec: RequestSpec) -> str | None:
    """The error the arm's server raises for this request, or None (the checks of SimulatedEngine.generate and
    EngineCore.add_request, made before the request enters the simulation)."""
    if spec.max_tokens < 1:  # a replayed failed request (expect_error): the server's body validation refuses it
        return "max_tokens: Input should be greater than or equal to 1"
    if spec.prompt_tokens + spec.max_tokens > model.max_model_len:
        return (
            f"prompt ({spec.prompt_tokens} tokens) + max_tokens ({spec.max_tokens}) exceeds max_model_len "
            f"{model.max_model_len}"
        )
    needed = -(-(spec.prompt_tokens + spec.max_tokens + core.max_k) // core.limits.block_size)
    if needed > core.total_blocks:
        return f"request needs {needed} KV blocks, the engine has {core.total_blocks}"
    return None


def _sim_request(request_id: str, spec: RequestSpec, arrival: float) -> SimRequest:
    # What the arm's server makes of the body: the `specdrill` hints carry category and token counts.
    return SimRequest(
        request_id=request_id, category=spec.category or "chat", prompt_tokens=spec.prompt_tokens,
        max_tokens=spec.max_tokens, arrival=arrival, stop_at=None if spec.ignore_eos else spec.output_tokens,
    )  # fmt: skip


def worker_stops(
    sent: Sequence[Sent], records: dict[str, RequestRecord], *, scale: float, until: dict[int, float], drain_s: float
) -> dict[int, float]:
    """When each load worker stops: drain_s after `until` (its last send, or the closed-loop duration), or as
    soon as nothing of its own is in flight any more."""
    finish: dict[int, float] = dict(until)
    for s in sent:
        record = records.get(s.request_id) if s.request is not None else None
        done = s.at_s if s.request is None else (math.inf if record is None else record.finished * scale)
        finish[s.worker] = max(finish.get(s.worker, 0.0), done)
    return {w: min(finish[w], until[w] + drain_s) for w in until}


def simulate_open_loop(model: ArmModel, unit: Unit, plans: Sequence[WorkerPlan], traffic: Traffic,
                       drain_s: float) -> UnitRun:  # fmt: skip
    """The shape's arrivals at their offsets; request i goes to engine i mod N (independent replicas)."""
    n_engines = len(model.engines)
    cores = [model.core(rank, unit) for rank in range(n_engines)]
    scale = model.time_scale
    sent: list[Sent] = []
    arrivals: list[list[SimRequest]] = [[] for _ in cores]
    for position, (item, worker) in enumerate(traffic.schedule()):
        rank = position % n_engines
        request_id = plans[worker].request_id(item.index)
        error = _refusal(model, cores[rank], item.spec)
        # time_scale slows the simulated hardware as in a real-time run: engine seconds = wall seconds / scale.
        request = None if error else _sim_request(request_id, item.spec, item.offset_s / scale)
        sent.append(Sent(item.index, request_id, worker, item.offset_s, item.phase, item.spec, item.prompt_sha256,
                         rank, request, error))  # fmt: skip
        if request is not None:
            arrivals[rank].append(request)
    # A worker waits drain_s after its LAST send, then cancels what is still in flight.
    last_send = {plan.worker: 0.0 for plan in plans}
    for s in sent:
        last_send[s.worker] = max(last_send[s.worker], s.at_s)
    stop = (max(last_send.values()) + drain_s) / scale
    records: dict[str, RequestRecord] = {}
    for core, requests in zip(cores, arrivals, strict=True):
        if requests:
            records.update((r.request_id, r) for r in run_open_loop(core, requests, stop_at=stop).records)
    stops = worker_stops(sent, records, scale=scale, until=last_send, drain_s=drain_s)
    return UnitRun(sent=sent, records=records, stops=stops, cores=cores)


def simulate_closed_loop(model: ArmModel, unit: Unit, plans: Sequence[WorkerPlan], traffic: Traffic,
                         drain_s: float) -> UnitRun:  # fmt: skip
    """`users` users, each sending its next request when its previous one ends, until the shape's duration.

    As the load workers do: user u belongs to worker u mod W, and a worker numbers its requests w, w + W, ...
    in send order. Request j (in send order) goes to engine j mod N.
    """
    n_workers = len(plans)
    shape = plans[0].shape
    scale = model.time_scale
    duration = shape.duration / scale  # engine seconds
    phase = shape.phases()[0].name
    cores = [model.core(rank, unit) for rank in range(len(model.engines))]
    counters = [0] * n_workers
    sent: list[Sent] = []

    def send(user: int, at: float) -> tuple[int, SimRequest | None] | None:
        if at >= duration:
            return None  # the user's loop ends at the shape's duration
        worker = user % n_workers
        index = worker + n_workers * counters[worker]
        counters[worker] += 1
        spec, sha = traffic.spec(index)
        rank = len(sent) % len(cores)
        request_id = plans[worker].request_id(index)
        error = _refusal(model, cores[rank], spec)
        request = None if error else _sim_request(request_id, spec, at)
        sent.append(Sent(index, request_id, worker, at * scale, phase, spec, sha, rank, request, error))
        return rank, request

    users = int(getattr(shape, "users", 0))
    stop = (shape.duration + drain_s) / scale
    done = run_closed_loop(cores, send, users=users, stop_at=stop, retry_s=ERROR_RESPONSE_S / scale)
    records = {r.request_id: r for engine in done for r in engine}
    # A worker stops at the duration once nothing of its own is in flight, at the latest drain_s after it.
    until = {plan.worker: shape.duration for plan in plans}
    stops = worker_stops(sent, records, scale=scale, until=until, drain_s=drain_s)
    return UnitRun(sent=sent, records=records, stops=stops, cores=cores)


def traffic_of(campaign: Campaign, arm: ArmSpec, unit: Unit, *, run: str, traces: str) -> Traffic:
    """The unit's requests, from any arm's plans (they do not depend on the arm)."""
    return Traffic(plans_for(campaign, arm, unit, run=run, url="", traces=traces))


def play(model: ArmModel, unit: Unit, plans: Sequence[WorkerPlan], traffic: Traffic, drain_s: float, *,
         open_loop: bool) -> UnitRun:  # fmt: skip
    """The unit's traffic played into the arm's engines: at the shape's offsets, or user by user."""
    simulate = simulate_open_loop if open_loop else simulate_closed_loop
    return simulate(model, unit, plans, traffic, drain_s)
