"""`specdrill run` in virtual time: the same run directory, on the simulated engine, without Ray or HTTP.

Each (arm, shape, repeat) unit gets exactly the traffic the load workers would send (the same plans, the same
`open_loop_schedule`, so request ids, offsets, phases and prompts match), played into fresh simulated engines
(one per rank of the arm's topology, requests round-robin) in virtual time. The rows, step timelines, unit
markers and manifest entries are the run directory `orchestrator.run` writes (orchestrator.rundir), so the report
reads both; the manifest says `"mode": "virtual"`.

Virtual time is anchored at a fixed epoch, with every unit in its own slot after it (the arms one after the
other, as a real run deploys them), so the same campaign gives the same traces on every machine and resumes
into the same slots.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

import serve_apps
from loadshapes.mixes import RequestSpec
from loadshapes.plan import Planned, WorkerPlan, open_loop_schedule
from loadshapes.shapes import ShapeBase
from loadshapes.sse import StreamResult, telemetry_columns
from loadshapes.trace import FILE_SCHEMA, PartWriter, writer_id
from orchestrator.campaign import Campaign, CampaignError
from orchestrator.interrupts import raise_pending
from orchestrator.load_workers import WorkerSummary
from orchestrator.logs import get_logger
from orchestrator.rundir import (
    MANIFEST,
    RunStore,
    Unit,
    UnitResult,
    arm_entry,
    finish_run,
    open_run,
    plans_for,
    record_unit,
    unit_tpot_p50,
    units_of,
    write_timeline,
)
from serve_apps.arms import ArmSpec, SimulatedEngineConfig
from serve_apps.engines.simulated import SimulatedEngine
from serve_apps.service import ArmService, Placement
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile, load_profile
from serve_apps.sim.request import RequestRecord, SimRequest
from serve_apps.sim.virtual import run_open_loop

log = get_logger(__name__)

VIRTUAL_EPOCH_NS = 1_735_689_600 * 10**9  # 2025-01-01T00:00:00Z: fixed, so traces do not depend on the wall clock
UNIT_GAP_S = 60  # between unit slots (a real run spends it on collection, teardown, the next deploy and warm-up)
NODE_ID = "virtual"
SPEC_BATCH = 64  # closed-loop requests built at a time
ERROR_RESPONSE_S = 0.001  # how long a refused request takes to come back (a closed-loop user then sends again)
_NEVER = np.iinfo(np.int64).max

OK, TIMEOUT, CANCELLED, ERROR = range(4)
_STATUS = ("ok", "timeout", "cancelled", "error")
_ERROR_CLASS = (None, "timeout", "drain_timeout", "server_error")


# --- the engines of an arm ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VirtualEngine:
    """One rank of an arm: who it says it is, exactly as the arm's server would say it on every response."""

    rank: int
    engine_id: str
    info: dict[str, Any]  # ArmService.info(): what the manifest's arm entry is built from
    constant_columns: dict[str, Any]  # the trace columns that are the same on every response of this engine
    dp_rank: int = 0  # its rank in a vLLM data-parallel group; replicas and a single engine are each rank 0


@dataclass(frozen=True)
class ArmModel:
    arm: ArmSpec
    profile: Profile
    time_scale: float
    max_model_len: int
    seed: int
    engines: list[VirtualEngine]

    def core(self, rank: int, unit: Unit) -> EngineCore:
        """A fresh engine per unit: a unit's result does not depend on which units ran before it (resume)."""
        key = zlib.crc32(f"{unit.shape}:{unit.repeat}:{rank}".encode())
        return EngineCore(
            self.profile,
            self.arm.policy.resolve(self.arm.topology),
            seed=self.seed + key,
            engine_id=self.engines[rank].engine_id,
        )


def engines_of(arm: ArmSpec) -> int:
    """Engines of the arm: its replicas, or a vLLM data-parallel group's ranks."""
    return 1 if arm.topology.kind == "single" else arm.topology.size


def arm_model(arm: ArmSpec) -> ArmModel:
    """The arm's engines, each with the telemetry its real-time twin (serve_apps.engines.simulated) reports."""
    config = arm.engine
    assert isinstance(config, SimulatedEngineConfig)
    profile = load_profile(config.profile)
    resolved = arm.policy.resolve(arm.topology)  # DP > 1 drops the schedule, as vLLM does
    engines = []
    for rank in range(engines_of(arm)):
        replica_id = f"sim-{rank}"
        engine_id = f"{arm.name}-{replica_id}"
        twin = SimulatedEngine(
            profile, resolved, seed=config.seed, time_scale=config.time_scale, engine_id=engine_id,
            max_model_len=config.max_model_len,
        )  # fmt: skip
        service = ArmService(
            arm, twin, Placement(replica_id=replica_id, node_id=NODE_ID, node_ip=NODE_ID),
            {"specdrill": serve_apps.__version__},
        )  # fmt: skip
        info = service.info()
        # The same flattening the load worker applies to a response's telemetry; only the per-engine part is used.
        columns = telemetry_columns(StreamResult(telemetry={**info, "engine_id": engine_id}))
        constant = {k: columns[k] for k in ("resolved_speculative_config", "schedule_dropped", "replica_id",
                                            "engine_id", "node_id")}  # fmt: skip
        dp_rank = rank if arm.topology.kind == "data_parallel" else 0
        engines.append(
            VirtualEngine(rank=rank, engine_id=engine_id, info=info, constant_columns=constant, dp_rank=dp_rank)
        )
    return ArmModel(
        arm=arm, profile=profile, time_scale=config.time_scale, max_model_len=config.max_model_len,
        seed=config.seed, engines=engines,
    )  # fmt: skip


# --- traffic --------------------------------------------------------------------------------------------------
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
    in send order. Request j (in send order) goes to engine j mod N. With several engines a finish on one can
    send a request to another, so the engine furthest behind in time always steps next.
    """
    n_workers = len(plans)
    shape = plans[0].shape
    scale = model.time_scale
    duration = shape.duration / scale  # engine seconds
    stop = (shape.duration + drain_s) / scale
    phase = shape.phases()[0].name
    users = int(getattr(shape, "users", 0))
    cores = [model.core(rank, unit) for rank in range(len(model.engines))]
    clocks = [0.0] * len(cores)
    counters = [0] * n_workers
    owner: dict[str, int] = {}  # request id -> user
    sent: list[Sent] = []
    finished: list[list[SimRequest]] = [[] for _ in cores]
    sends: list[tuple[float, int, int]] = [(0.0, u, u) for u in range(users)]  # (engine time, tie-break, user)
    heapq.heapify(sends)
    ticket = users
    while True:
        busy = [e for e, core in enumerate(cores) if core.has_work()]
        earliest = min((clocks[e] for e in busy), default=math.inf)
        if sends and sends[0][0] <= earliest:
            at, _, user = heapq.heappop(sends)
            if at >= duration:
                continue  # the user's loop ends at the shape's duration
            worker = user % n_workers
            index = worker + n_workers * counters[worker]
            counters[worker] += 1
            spec, sha = traffic.spec(index)
            rank = len(sent) % len(cores)
            request_id = plans[worker].request_id(index)
            error = _refusal(model, cores[rank], spec)
            request = None if error else _sim_request(request_id, spec, at)
            sent.append(Sent(index, request_id, worker, at * scale, phase, spec, sha, rank, request, error))
            if request is None:
                heapq.heappush(sends, (at + ERROR_RESPONSE_S / scale, ticket, user))
                ticket += 1
                continue
            owner[request_id] = user
            if not cores[rank].has_work():
                clocks[rank] = max(clocks[rank], at)  # an idle engine starts when the request arrives
            cores[rank].add_request(request)
            continue
        if not busy or earliest > stop:
            break  # every user is done and nothing is in flight, or the drain is over
        e = min(busy, key=lambda i: clocks[i])
        others = min((clocks[i] for i in busy if i != e), default=math.inf)
        outcome = cores[e].run_steps(clocks[e], next_arrival=min(others, sends[0][0] if sends else math.inf),
                                     stop_on_finish=True)  # fmt: skip
        if outcome.steps == 0:
            raise RuntimeError(f"simulated engine {model.engines[e].engine_id} is stuck: work queued, none schedulable")
        clocks[e] = outcome.end
        finished[e] += outcome.finished
        for request in outcome.finished:
            assert request.finished_at is not None
            heapq.heappush(sends, (request.finished_at, ticket, owner[request.request_id]))
            ticket += 1
    # Records once per engine at the end: records_for reads the whole step table on every call.
    records = {r.request_id: r for core, done in zip(cores, finished, strict=True) for r in core.records_for(done)}
    # A worker stops at the duration once nothing of its own is in flight, at the latest drain_s after it.
    until = {plan.worker: shape.duration for plan in plans}
    stops = worker_stops(sent, records, scale=scale, until=until, drain_s=drain_s)
    return UnitRun(sent=sent, records=records, stops=stops, cores=cores)


# --- rows -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowContext:
    campaign: str
    run: str
    policy: str | None
    topology: str | None
    start_ns: int
    time_scale: float
    request_timeout_s: float
    store_token_times: bool
    store_prompts: bool
    speculative: bool  # the engine runs a drafter (vLLM reports metrics.speculative_decoding)
    repeat: int = 0
    shape: ShapeBase | None = None  # its rate at each scheduled offset is the row's offered rate (open loop)
    store_step_lists: bool = False


def _to_ns(start_ns: int, seconds: np.ndarray) -> np.ndarray:
    ns: np.ndarray = start_ns + np.rint(np.asarray(seconds, dtype=np.float64) * 1e9).astype(np.int64)
    return ns


def _column(n: int, rows: np.ndarray, values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """A column of n rows holding `values` at `rows` and null elsewhere."""
    full = np.zeros(n, dtype=values.dtype)
    full[rows] = values
    mask = np.ones(n, dtype=bool)
    mask[rows] = False
    return pa.array(full, type=kind, mask=mask)


def _list_column(n: int, rows: np.ndarray, lengths: np.ndarray, values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """A list column: row rows[i] holds the next lengths[i] values; other rows are null."""
    counts = np.zeros(n, dtype=np.int64)
    counts[rows] = lengths
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    mask = np.ones(n, dtype=bool)
    mask[rows] = False
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(values, kind.value_type), type=kind, mask=pa.array(mask)
    )


def _segments(lengths: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(lengths)), lengths)


def latency_arrays(
    scheduled_ns: np.ndarray, lengths: np.ndarray, times_ns: np.ndarray
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """loadshapes.sse.latency_columns for many rows at once, with the same arithmetic (so the same floats).

    Rows are consecutive segments of times_ns; returns column -> (values, valid) for first token and the
    per-token latencies (ttft_s and e2e_s need the done time, computed by the caller).
    """
    n = len(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    has_token = lengths > 0
    first = np.where(has_token, times_ns[np.minimum(starts, max(len(times_ns) - 1, 0))] if len(times_ns) else 0, 0)
    last = np.where(has_token, times_ns[np.maximum(starts + lengths - 1, 0)] if len(times_ns) else 0, 0)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {
        "first_token_ns": (first, has_token),
        "ttft_s": ((first - scheduled_ns) / 1e9, has_token),
    }
    multi = lengths > 1
    gaps_n = np.maximum(lengths - 1, 0)
    tpot = np.zeros(n)
    tpot[multi] = (last[multi] - first[multi]) / 1e9 / gaps_n[multi]
    out["tpot_s"] = (tpot, multi)
    # Inter-token gaps, sorted within each row: numpy's linear quantile, as sse._quantile computes it.
    segment = _segments(lengths)
    diffs = np.diff(times_ns) if len(times_ns) else np.zeros(0, np.int64)
    within = segment[1:] == segment[:-1] if len(segment) else np.zeros(0, bool)
    gaps = diffs[within]
    gap_segment = segment[1:][within]
    if len(gaps) and gaps.min() >= 0 and gaps.max() < 1 << 40 and n < 1 << 22:
        ordered = np.sort((gap_segment << 40) | gaps) & ((1 << 40) - 1)  # one int64 sort: ~4x faster than lexsort
    else:
        ordered = gaps[np.lexsort((gaps, gap_segment))]
    gap_starts = np.concatenate([[0], np.cumsum(gaps_n)[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    for name, q in (("itl_p50_s", 0.5), ("itl_p99_s", 0.99)):
        values = np.zeros(n)
        position = q * (gaps_n[multi] - 1)
        low = position.astype(np.int64)
        high = np.minimum(low + 1, gaps_n[multi] - 1)
        base = gap_starts[multi]
        lo_v, hi_v = ordered[base + low], ordered[base + high]
        values[multi] = (lo_v + (hi_v - lo_v) * (position - low)) / 1e9
        out[name] = (values, multi)
    top = np.zeros(n)
    top[multi] = ordered[gap_starts[multi] + gaps_n[multi] - 1] / 1e9
    out["itl_max_s"] = (top, multi)
    return out


def spec_arrays(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """RequestRecord.spec_decode_metrics() for many records at once: per-step drafted/accepted over the steps
    that verified drafts (vLLM leaves the others out) and the mean acceptance length."""
    drafted = np.concatenate([r.step_drafted for r in records]) if records else np.zeros(0, np.int64)
    accepted = np.concatenate([r.step_accepted for r in records]) if records else np.zeros(0, np.int64)
    lengths = np.fromiter((len(r.step_drafted) for r in records), dtype=np.int64, count=len(records))
    segment = _segments(lengths)
    verified = drafted > 0
    steps = np.bincount(segment[verified], minlength=len(records))
    accepted_sum = np.bincount(segment[verified], weights=accepted[verified], minlength=len(records))
    mean_length = np.ones(len(records))
    has = steps > 0
    mean_length[has] = 1.0 + accepted_sum[has] / steps[has]
    return {
        "steps": steps,
        "per_step_drafted": drafted[verified],
        "per_step_accepted": accepted[verified],
        "mean_acceptance_length": mean_length,
    }


def _concat(arrays: Sequence[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def trace_table(ctx: RowContext, run: UnitRun, engines: Sequence[VirtualEngine]) -> pa.Table:
    """One row per scheduled request, as the load worker writes it (FILE_SCHEMA: the partition columns live in
    the path), built column by column: a simulated hour is ~10^5 rows."""
    sent = run.sent
    n = len(sent)
    scale = ctx.time_scale
    scheduled = ctx.start_ns + np.rint(np.fromiter((s.at_s for s in sent), np.float64, n) * 1e9).astype(np.int64)
    stops = {w: ctx.start_ns + round(t * 1e9) for w, t in run.stops.items()}
    stop_ns = np.fromiter((stops[s.worker] for s in sent), np.int64, n)  # each worker stops on its own
    deadline = scheduled + round(ctx.request_timeout_s * 1e9)
    record_list = [run.records.get(s.request_id) if s.request else None for s in sent]
    has_record = np.fromiter((r is not None for r in record_list), bool, n)
    refused = np.fromiter((s.error is not None for s in sent), bool, n)
    done = np.full(n, _NEVER, dtype=np.int64)
    rec_rows = np.flatnonzero(has_record)
    recs = _records_at(record_list, rec_rows)
    done[rec_rows] = _to_ns(ctx.start_ns, np.fromiter((r.finished for r in recs), np.float64, len(recs)) * scale)
    status = np.full(n, CANCELLED, dtype=np.int64)
    ok = has_record & (done <= deadline) & (done <= stop_ns)
    status[ok] = OK
    status[~ok & ~refused & (deadline <= stop_ns)] = TIMEOUT  # the client gave up before the workers stopped
    status[refused] = ERROR

    # Tokens: every token of an ok row; those that arrived before the deadline of a timed-out one.
    token_rows = np.flatnonzero(has_record & ((status == OK) | (status == TIMEOUT)))
    token_recs = _records_at(record_list, token_rows)
    raw_lengths = np.fromiter((len(r.token_times) for r in token_recs), np.int64, len(token_recs))
    raw = _to_ns(ctx.start_ns, _concat([r.token_times for r in token_recs], np.float64) * scale)
    limit = np.where(status[token_rows] == OK, _NEVER, deadline[token_rows])
    keep = raw <= np.repeat(limit, raw_lengths)
    times = raw[keep]
    lengths = np.bincount(_segments(raw_lengths)[keep], minlength=len(token_rows)).astype(np.int64)
    latency = latency_arrays(scheduled[token_rows], lengths, times)

    ok_rows = np.flatnonzero(status == OK)
    ok_recs = _records_at(record_list, ok_rows)
    sent_rows = np.flatnonzero(status != CANCELLED)

    columns: dict[str, pa.Array] = {}
    columns["campaign"] = pa.array([ctx.campaign] * n, pa.string())
    columns["run"] = pa.array([ctx.run] * n, pa.string())
    columns["policy"] = pa.array([ctx.policy] * n, pa.string())
    columns["topology"] = pa.array([ctx.topology] * n, pa.string())
    columns["phase"] = pa.array([s.phase for s in sent], pa.string())
    columns["worker"] = pa.array(np.fromiter((s.worker for s in sent), np.int32, n), pa.int32())
    columns["request_id"] = pa.array([s.request_id for s in sent], pa.string())
    columns["repeat"] = pa.array(np.full(n, ctx.repeat, np.int32), pa.int32())
    columns["request_index"] = pa.array(np.fromiter((s.index for s in sent), np.int64, n), pa.int64())
    columns["category"] = pa.array([s.spec.category for s in sent], pa.string())
    columns["prompt_sha256"] = pa.array([s.prompt_sha256 for s in sent], pa.string())
    columns["prompt"] = pa.array([s.spec.prompt if ctx.store_prompts else None for s in sent], pa.string())
    columns["scheduled_ns"] = pa.array(scheduled, pa.int64())
    columns["unit_start_ns"] = pa.array(np.full(n, ctx.start_ns, np.int64), pa.int64())
    offsets = np.fromiter((s.at_s for s in sent), np.float64, n)
    columns["offset_s"] = pa.array(offsets, pa.float64())
    if ctx.shape is not None and ctx.shape.open_loop:
        columns["offered_rate_rps"] = pa.array(np.asarray(ctx.shape.rate_at(offsets), np.float64), pa.float64())
    else:
        columns["offered_rate_rps"] = pa.nulls(n, pa.float64())
    columns["sent_ns"] = _column(n, sent_rows, scheduled[sent_rows], pa.int64())
    first_token, has_token = latency["first_token_ns"]
    columns["first_token_ns"] = _column(n, token_rows[has_token], first_token[has_token], pa.int64())
    columns["done_ns"] = _column(n, ok_rows, done[ok_rows], pa.int64())
    columns["send_lateness_ns"] = _column(n, sent_rows, np.zeros(len(sent_rows), np.int64), pa.int64())
    prompt_tokens = np.fromiter((s.spec.prompt_tokens for s in sent), np.int32, n)
    columns["prompt_tokens"] = _column(n, sent_rows, prompt_tokens[sent_rows], pa.int32())
    # A timed-out stream's usage counts the tokens that arrived; with none, no usage arrived at all.
    columns["output_tokens"] = _column(n, token_rows[lengths > 0], lengths[lengths > 0].astype(np.int32), pa.int32())
    columns["ttft_s"] = _column(n, token_rows[has_token], latency["ttft_s"][0][has_token], pa.float64())
    columns["e2e_s"] = _column(n, ok_rows, (done[ok_rows] - scheduled[ok_rows]) / 1e9, pa.float64())
    for name in ("tpot_s", "itl_p50_s", "itl_p99_s", "itl_max_s"):
        values, valid = latency[name]
        columns[name] = _column(n, token_rows[valid], values[valid], pa.float64())
    if ctx.store_token_times:
        columns["token_times_ns"] = _list_column(n, token_rows, lengths, times, pa.list_(pa.int64()))
    else:
        columns["token_times_ns"] = pa.nulls(n, pa.list_(pa.int64()))
    columns.update(_telemetry_columns(ctx, n, ok_rows, ok_recs, scheduled, [sent[i].rank for i in ok_rows], engines))
    columns["status"] = pa.array([_STATUS[s] for s in status], pa.string())
    columns["error_class"] = pa.array([_ERROR_CLASS[s] for s in status], pa.string())
    columns["error_message"] = pa.array(
        [_error_message(ctx, sent[i], int(status[i]), int(stop_ns[i] - scheduled[i])) for i in range(n)], pa.string()
    )
    return pa.Table.from_arrays([columns[name] for name in FILE_SCHEMA.names], schema=FILE_SCHEMA)


def _records_at(records: Sequence[RequestRecord | None], rows: np.ndarray) -> list[RequestRecord]:
    picked = [records[i] for i in rows]
    found = [r for r in picked if r is not None]
    assert len(found) == len(picked), "rows picked where a record exists"
    return found


def _error_message(ctx: RowContext, sent: Sent, status: int, waited_ns: int) -> str | None:
    # The load worker's messages, word for word.
    if status == TIMEOUT:
        return f"no complete response within {ctx.request_timeout_s} s"
    if status == CANCELLED:
        return f"still in flight {waited_ns / 1e9:.1f} s after its scheduled send when the worker stopped"
    if status == ERROR:
        return f"error event in stream: {sent.error}"
    return None


def _telemetry_columns(
    ctx: RowContext,
    n: int,
    rows: np.ndarray,
    records: Sequence[RequestRecord],
    scheduled: np.ndarray,
    ranks: Sequence[int],
    engines: Sequence[VirtualEngine],
) -> dict[str, pa.Array]:
    """What the final chunk's `specdrill` object and metrics.speculative_decoding carry (ok rows only: a
    response cut short never reaches its final chunk)."""
    scale = ctx.time_scale
    out: dict[str, pa.Array] = {}
    out["queue_wait_s"] = _column(
        n, rows, np.fromiter(((r.first_scheduled - r.arrival) * scale for r in records), np.float64), pa.float64()
    )
    out["server_received_ns"] = _column(n, rows, scheduled[rows], pa.int64())  # no network: received when sent
    for name, attribute in (("server_first_scheduled_ns", "first_scheduled"), ("server_first_token_ns", "first_token"),
                            ("server_done_ns", "finished")):  # fmt: skip
        seconds = np.fromiter((getattr(r, attribute) for r in records), np.float64, len(records)) * scale
        out[name] = _column(n, rows, _to_ns(ctx.start_ns, seconds), pa.int64())
    step_lengths = np.fromiter((len(r.step_batch_size) for r in records), np.int64, len(records))
    batch = _concat([r.step_batch_size for r in records], np.int32)
    executed = _concat([r.step_k for r in records], np.int16)
    out.update(_step_summary_columns(n, rows, step_lengths, batch, executed))
    if ctx.store_step_lists:
        out["step_batch_size"] = _list_column(n, rows, step_lengths, batch, pa.list_(pa.int32()))
        out["step_k"] = _list_column(n, rows, step_lengths, executed, pa.list_(pa.int16()))
    else:
        out["step_batch_size"] = pa.nulls(n, pa.list_(pa.int32()))
        out["step_k"] = pa.nulls(n, pa.list_(pa.int16()))
    if ctx.speculative:
        spec = spec_arrays(records)
        verified = spec["steps"] > 0  # vLLM omits the per-step lists of a request that verified no drafts
        segment = _segments(spec["steps"])
        for name, total in (("per_step_drafted", "drafted_tokens"), ("per_step_accepted", "accepted_tokens")):
            sums = np.bincount(segment, weights=spec[name], minlength=len(records)).astype(np.int64)
            out[total] = _column(n, rows, sums, pa.int64())
            if ctx.store_step_lists:
                out[name] = _list_column(
                    n, rows[verified], spec["steps"][verified], spec[name].astype(np.int16), pa.list_(pa.int16())
                )
            else:
                out[name] = pa.nulls(n, pa.list_(pa.int16()))
        out["spec_steps"] = _column(n, rows, spec["steps"].astype(np.int32), pa.int32())
        out["mean_acceptance_length"] = _column(n, rows, spec["mean_acceptance_length"], pa.float64())
    else:  # no speculation: vLLM sends metrics.speculative_decoding = null
        for name in ("per_step_drafted", "per_step_accepted"):
            out[name] = pa.nulls(n, pa.list_(pa.int16()))
        zeros = np.zeros(len(records), np.int64)
        out["spec_steps"] = _column(n, rows, zeros.astype(np.int32), pa.int32())
        out["drafted_tokens"] = _column(n, rows, zeros, pa.int64())
        out["accepted_tokens"] = _column(n, rows, zeros, pa.int64())
        out["mean_acceptance_length"] = pa.nulls(n, pa.float64())
    for name in ("resolved_speculative_config", "replica_id", "engine_id", "node_id"):
        values: list[Any] = [None] * n
        for row, rank in zip(rows, ranks, strict=True):
            values[row] = engines[rank].constant_columns[name]
        out[name] = pa.array(values, pa.string())
    dropped: list[bool | None] = [None] * n
    for row, rank in zip(rows, ranks, strict=True):
        dropped[row] = engines[rank].constant_columns["schedule_dropped"]
    out["schedule_dropped"] = pa.array(dropped, pa.bool_())
    return out


def _step_summary_columns(
    n: int, rows: np.ndarray, lengths: np.ndarray, batch: np.ndarray, executed: np.ndarray
) -> dict[str, pa.Array]:
    """loadshapes.trace.step_summaries for many rows at once (rows[i] holds the next lengths[i] steps)."""
    m = len(lengths)
    segment = _segments(lengths)
    batch_sum = np.bincount(segment, weights=batch, minlength=m)
    has = lengths > 0
    mean = np.zeros(m)
    mean[has] = batch_sum[has] / lengths[has]
    top = np.zeros(m, np.int32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if m else np.zeros(0, np.int64)
    if has.any():
        top[has] = np.maximum.reduceat(batch, starts[has])
    return {
        "engine_steps": _column(n, rows, lengths.astype(np.int32), pa.int32()),
        "step_batch_mean": _column(n, rows[has], mean[has], pa.float64()),
        "step_batch_max": _column(n, rows[has], top[has], pa.int32()),
        "step_k_sum": _column(n, rows, np.bincount(segment, weights=executed, minlength=m).astype(np.int64),
                              pa.int64()),
    }


# --- timelines and summaries ----------------------------------------------------------------------------------
def timelines(
    run: UnitRun, engines: Sequence[VirtualEngine], *, start_ns: int, scale: float
) -> dict[str, dict[str, list[Any]]]:
    """The /specdrill/timeline answer of each engine (epoch seconds), steps that started before the stop."""
    out: dict[str, dict[str, list[Any]]] = {}
    for engine, core in zip(engines, run.cores, strict=True):
        steps = core.steps
        starts = steps.column("start") * scale
        keep = starts < run.stop_s
        data: dict[str, list[Any]] = {}
        for name in ("start", "end"):
            seconds = steps.column(name)[keep] * scale
            data[name] = (_to_ns(start_ns, seconds) / 1e9).tolist()
        for name in ("batch_size", "k", "drafted", "accepted", "waiting", "num_prefill", "batched_tokens", "kv_tokens"):
            data[name] = steps.column(name)[keep].astype(int).tolist()
        data["dp_rank"] = [engine.dp_rank] * len(data["start"])
        out[engine.engine_id] = data
    return out


def worker_summaries(
    unit: Unit, run: UnitRun, table: pa.Table, plans: Sequence[WorkerPlan], *, start_ns: int, files: list[str]
) -> list[WorkerSummary]:
    """One summary per load worker of the real run; the rows were all written by one writer (w0)."""
    workers = table.column("worker").to_numpy()
    status = np.asarray(table.column("status").to_pylist(), dtype=object)
    begin = table.column("scheduled_ns").to_numpy()
    # In flight until done, until the timeout, or until the stop (cancelled); a refused request for no time.
    end = np.asarray(table.column("done_ns").fill_null(0).to_numpy(), dtype=np.int64)
    stop_ns = np.asarray([start_ns + round(run.stops[int(w)] * 1e9) for w in workers], dtype=np.int64)
    end = np.where(status == "ok", end, np.where(status == "cancelled", stop_ns, begin))
    timed_out = status == "timeout"
    end[timed_out] = begin[timed_out] + round(plans[0].request_timeout_s * 1e9)
    summaries = []
    for plan in plans:
        mine = workers == plan.worker
        statuses: dict[str, int] = {}
        for value in status[mine]:
            statuses[str(value)] = statuses.get(str(value), 0) + 1
        count = int(mine.sum())
        summaries.append(
            WorkerSummary(
                worker=plan.worker, arm=unit.arm, shape=unit.shape, repeat=unit.repeat, scheduled=count, sent=count,
                rows_written=count, files=files if plan.worker == 0 else [], start_ns=start_ns,
                lateness_p50_s=0.0, lateness_p99_s=0.0, lateness_max_s=0.0, saturated=False,
                max_in_flight=_max_overlap(begin[mine], end[mine]), statuses=statuses, node_id=NODE_ID, exit_code=0,
            )
        )  # fmt: skip
    return summaries


def _max_overlap(begin: np.ndarray, end: np.ndarray) -> int:
    if not len(begin):
        return 0
    times = np.concatenate([begin, end])
    steps = np.concatenate([np.ones(len(begin), np.int64), -np.ones(len(end), np.int64)])
    order = np.lexsort((steps, times))  # at a tie an end comes first: a finished request frees its place
    return int(np.cumsum(steps[order]).max())


# --- units and the campaign -----------------------------------------------------------------------------------
def unit_starts(campaign: Campaign) -> dict[str, int]:
    """Each unit's slot in virtual time: the arms in order, each unit after the previous one's drain."""
    starts: dict[str, int] = {}
    t = VIRTUAL_EPOCH_NS
    for arm in campaign.arms():
        for unit in units_of(campaign, arm):
            starts[unit.key] = t
            slot = math.ceil(campaign.shapes[unit.shape].duration + campaign.load.drain_s) + UNIT_GAP_S
            t += slot * 10**9
    return starts


def simulate_unit(
    campaign: Campaign, model: ArmModel, unit: Unit, *, run: str, store: RunStore, start_ns: int,
    traffic: Traffic | None = None,
) -> UnitResult:  # fmt: skip
    """One (arm, shape, repeat): simulate, then write its rows, timeline and marker (last: the unit's proof)."""
    removed = store.remove_partial(unit)
    if removed:
        log.info("unit.partial_removed", unit=unit.key, files=removed)
    arm = model.arm
    began = time.perf_counter()
    plans = plans_for(campaign, arm, unit, run=run, url=f"virtual://{arm.name}", traces=store.traces)
    shape = campaign.shapes[unit.shape]
    simulate = simulate_open_loop if shape.open_loop else simulate_closed_loop
    outcome = simulate(model, unit, plans, traffic or Traffic(plans), campaign.load.drain_s)
    simulated = time.perf_counter()
    ctx = RowContext(
        campaign=campaign.name, run=run, policy=arm.policy.label, topology=arm.topology.label, start_ns=start_ns,
        time_scale=model.time_scale, request_timeout_s=campaign.load.request_timeout_s,
        store_token_times=campaign.load.store_token_times, store_prompts=campaign.store_prompts,
        speculative=arm.policy.resolve(arm.topology).num_speculative_tokens > 0, repeat=unit.repeat, shape=shape,
        store_step_lists=campaign.load.store_step_lists,
    )  # fmt: skip
    table = trace_table(ctx, outcome, model.engines)
    # The writer id of load worker 0, so RunStore.remove_partial finds these files when the unit is redone.
    writer = PartWriter(store.traces, writer_id=writer_id(unit.arm, unit.shape, unit.repeat, 0))
    if table.num_rows:
        writer.write_table(unit.arm, unit.shape, table)
    steps = write_timeline(store, unit, timelines(outcome, model.engines, start_ns=start_ns, scale=model.time_scale))
    summaries = worker_summaries(unit, outcome, table, plans, start_ns=start_ns, files=writer.files)
    result = UnitResult(
        unit=unit, start_ns=start_ns, end_ns=start_ns + round(outcome.stop_s * 1e9), duration_s=shape.duration,
        scheduled=len(outcome.sent), rows=writer.rows_written, saturated=False, lateness_p99_s=0.0,
        workers=summaries, timeline_steps=steps, tpot_p50_s=unit_tpot_p50(store, unit),
    )  # fmt: skip
    raise_pending()  # a signal that came during the unit leaves it incomplete, even one Python swallowed
    store.write_json(store.unit_marker(unit), result.model_dump(mode="json"))
    log.info(
        "unit.simulated", unit=unit.key, rows=result.rows, steps=steps, simulate_s=round(simulated - began, 3),
        rows_s=round(time.perf_counter() - simulated, 3),
    )  # fmt: skip
    return result


def require_simulated(campaign: Campaign) -> None:
    if not isinstance(campaign.engine, SimulatedEngineConfig):
        raise CampaignError(
            f"engine: kind {campaign.engine.kind!r} cannot run in virtual time; only kind: simulated can"
        )


def simulate_campaign(
    campaign: Campaign,
    *,
    output: str | None = None,
    on_unit: Callable[[Unit, str, UnitResult | None], None] | None = None,
) -> tuple[RunStore, dict[str, Any]]:
    """`specdrill run` in virtual time: every pending unit of every arm; returns the run store and manifest.
    `on_unit` as run_campaign's: `(unit, "start", None)` before a unit, `(unit, "done", result)` after it.

    Units run shape by shape and repeat by repeat, every arm in turn, so each (shape, repeat)'s requests are
    built once; the results do not depend on the order (fresh engines per unit, fixed virtual time slots).
    """
    require_simulated(campaign)
    campaign.require_traffic()
    if output is not None:
        campaign = campaign.model_copy(update={"output": output})
    store = RunStore(campaign.output_dir())
    manifest = open_run(campaign, store, mode="virtual")
    manifest["virtual_epoch_ns"] = VIRTUAL_EPOCH_NS
    starts = unit_starts(campaign)
    models: dict[str, ArmModel] = {}
    for arm in campaign.arms():
        if all(store.is_complete(u) for u in units_of(campaign, arm)):
            log.info("arm.complete", arm=arm.name)
            continue
        models[arm.name] = arm_model(arm)
        manifest["arms"][arm.name] = arm_entry(arm, f"virtual://{arm.name}", models[arm.name].engines[0].info)
    store.write_json(MANIFEST, manifest)
    for shape in campaign.shapes:
        for repeat in range(campaign.repeats):
            traffic: Traffic | None = None
            for name, model in models.items():
                unit = Unit(arm=name, shape=shape, repeat=repeat)
                if store.is_complete(unit):
                    continue
                if on_unit:
                    on_unit(unit, "start", None)
                log.info("unit.start", unit=unit.key)
                if traffic is None:
                    plans = plans_for(campaign, model.arm, unit, run=manifest["run"], url="", traces=store.traces)
                    traffic = Traffic(plans)
                result = simulate_unit(campaign, model, unit, run=manifest["run"], store=store,
                                       start_ns=starts[unit.key], traffic=traffic)  # fmt: skip
                record_unit(store, manifest, result)
                if on_unit:
                    on_unit(unit, "done", result)
    finish_run(store, manifest)
    return store, manifest
