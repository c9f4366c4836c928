"""Offline experiments on the virtual-time simulated engine: fixed batch sizes (closed loop, the oracle's) and
open-loop rate sweeps (ground truth's), their engines stepped by the one driver (serve_apps/sim/virtual.py) and
what users felt judged by loadshapes.experience. Their requests are a workload's token counts (no prompt text):
a campaign's traffic is the load workers' requests, played by orchestrator/virtual/traffic.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from loadshapes.arrivals import poisson_arrivals
from loadshapes.experience import LatencySummary, met, quantile, quantiles
from loadshapes.mixes import Workload
from loadshapes.slo import SloConfig
from orchestrator.logs import get_logger
from serve_apps.policies import SINGLE, OffPolicy, Topology
from serve_apps.policies import Policy as PolicyT
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.request import RequestRecord, SimRequest
from serve_apps.sim.virtual import run_closed_loop, run_open_loop

AnyPolicy = PolicyT  # the discriminated union of policy models
log = get_logger(__name__)


def make_requests(workload: Workload, arrivals: np.ndarray, *, seed: int, prefix: str = "req") -> list[SimRequest]:
    rng = np.random.default_rng(seed)
    prompts, outputs = workload.sample(rng, len(arrivals))
    return [
        SimRequest(
            request_id=f"{prefix}-{i}",
            category=workload.category,
            prompt_tokens=int(prompts[i]),
            max_tokens=workload.max_tokens,
            stop_at=None if workload.ignore_eos else int(outputs[i]),
            arrival=float(arrivals[i]),
        )
        for i in range(len(arrivals))
    ]


class FixedBatchPoint(BaseModel):
    model_config = ConfigDict(frozen=True)
    batch_size: int
    policy_tokens_per_s: float
    off_tokens_per_s: float
    speedup: float
    mean_executed_k: float  # the draft length the engine ran, per request-step of the steady window
    mean_acceptance_length: float | None  # None: no step of the window verified a draft (k = 0 there, or off)


class ClosedBatch(BaseModel):
    model_config = ConfigDict(frozen=True)
    tokens_per_s: float
    tpot_p50_s: float  # per-token latency of the requests that ran wholly inside the steady window
    steady_requests: int
    # Time-weighted mean of the engine's running batch in the window: below batch_size where the KV cache or
    # the token budget cannot hold that many requests at once.
    mean_batch: float
    # Of the steady requests' steps, as tpot_p50_s: the k the engine ran, and vLLM's mean acceptance length over
    # the steps that verified drafts (None where none did: k = 0 at this batch size, or speculation off). Until
    # issue 40 the length counted the whole run, whose ramp-up and drain run at smaller batches (a schedule's
    # k = 3 there gave "1.86" at a batch size whose k is 0).
    mean_executed_k: float
    mean_acceptance_length: float | None


def closed_batch(
    profile: Profile,
    policy: AnyPolicy,
    *,
    batch_size: int,
    workload: Workload,
    seed: int,
    rounds: int = 6,
    min_requests: int = 64,
    topology: Topology = SINGLE,
) -> ClosedBatch:
    """`batch_size` requests always in the engine (a finished one is replaced at once).

    Counted between the batch_size-th completion (the batch has mixed past its synchronized start) and the
    last replacement (after which the batch drains and shrinks).
    """
    core = EngineCore(profile, policy.resolve(topology), seed=seed)
    total = max(batch_size * rounds, min_requests)
    template = make_requests(workload, np.zeros(total), seed=seed + 1)

    issued = 0

    def send(_user: int, at: float) -> tuple[int, SimRequest | None] | None:
        nonlocal issued
        if issued == total:
            return None
        request = template[issued]
        request.arrival = at
        issued += 1
        return 0, request

    (records,) = run_closed_loop([core], send, users=min(batch_size, total))
    finishes = np.sort([r.finished for r in records])
    start = finishes[batch_size - 1]
    end = finishes[total - batch_size - 1] if total > 2 * batch_size else finishes[-1]
    tokens = sum(int(((r.token_times > start) & (r.token_times <= end)).sum()) for r in records)
    inside_window = [r for r in records if r.first_scheduled >= start and r.finished <= end]
    steady = [r.tpot for r in inside_window if r.output_tokens > 1]
    executed_k = np.concatenate([r.step_k for r in inside_window]) if inside_window else np.zeros(0)
    drafted = np.concatenate([r.step_drafted for r in inside_window]) if inside_window else np.zeros(0)
    accepted = np.concatenate([r.step_accepted for r in inside_window]) if inside_window else np.zeros(0)
    verified = drafted > 0
    steps = core.steps
    starts, ends = steps.column("start"), steps.column("end")
    inside = (starts >= start) & (ends <= end)
    durations = (ends - starts)[inside]
    return ClosedBatch(
        tokens_per_s=tokens / (end - start),
        tpot_p50_s=quantile(steady, 0.5),
        steady_requests=len(steady),
        mean_batch=float(np.average(steps.column("batch_size")[inside], weights=durations))
        if durations.sum() > 0
        else float(batch_size),
        mean_executed_k=float(executed_k.mean()) if executed_k.size else 0.0,
        mean_acceptance_length=1.0 + float(accepted[verified].sum()) / int(verified.sum()) if verified.any() else None,
    )


def fixed_batch(
    profile: Profile,
    policy: AnyPolicy,
    *,
    batch_sizes: Sequence[int],
    workload: Workload,
    seed: int,
    topology: Topology = SINGLE,
) -> list[FixedBatchPoint]:
    points = []
    for batch in batch_sizes:
        spec = closed_batch(profile, policy, batch_size=batch, workload=workload, seed=seed, topology=topology)
        off = closed_batch(profile, OffPolicy(), batch_size=batch, workload=workload, seed=seed)
        points.append(
            FixedBatchPoint(
                batch_size=batch,
                policy_tokens_per_s=spec.tokens_per_s,
                off_tokens_per_s=off.tokens_per_s,
                speedup=spec.tokens_per_s / off.tokens_per_s,
                mean_executed_k=spec.mean_executed_k,
                mean_acceptance_length=spec.mean_acceptance_length,
            )
        )
    return points


class WindowSummary(BaseModel):
    """Throughput over a measurement window; latencies of the requests that arrived in it."""

    model_config = ConfigDict(frozen=True)
    window_s: float
    arrived: int
    completed_in_window: int
    completion_rate: float  # completed requests per second within the window
    output_tokens_per_s: float
    goodput: float  # requests per second finishing in the window and meeting the SLO
    goodput_fraction: float  # of requests that arrived in the window, the share that met the SLO
    unfinished: int  # arrived in the window and never finished before the run stopped
    ttft: LatencySummary
    tpot: LatencySummary
    e2e: LatencySummary
    queue_wait: LatencySummary
    mean_executed_k: float  # per request-step, k = 0 steps included
    mean_drafted: float  # drafts actually verified per request-step (the drafter may propose fewer than k)
    mean_acceptance_length: float | None


def _met(records: Sequence[RequestRecord], slo: SloConfig) -> np.ndarray:
    # A record is a finished request: completed, with every latency measured (a one-token answer: tpot 0).
    return met(
        slo, [r.category for r in records], ok=np.ones(len(records), bool),
        ttft=np.fromiter((r.ttft for r in records), np.float64, len(records)),
        tpot=np.fromiter((r.tpot for r in records), np.float64, len(records)),
        e2e=np.fromiter((r.e2e for r in records), np.float64, len(records)),
    )  # fmt: skip


def window_summary(
    records: Sequence[RequestRecord], *, start: float, end: float, arrived: int, slo: SloConfig
) -> WindowSummary:
    """Throughput of the window [start, end); what users felt: the requests that arrived in it."""
    window = end - start
    done_in_window = [r for r in records if start <= r.finished < end]
    cohort = [r for r in records if start <= r.arrival < end]
    tokens = sum(int(((r.token_times >= start) & (r.token_times < end)).sum()) for r in records)
    steps_k = np.concatenate([r.step_k for r in cohort]) if cohort else np.zeros(0)
    drafted = np.concatenate([r.step_drafted for r in cohort]) if cohort else np.zeros(0)
    spec_steps = np.concatenate([r.step_drafted > 0 for r in cohort]) if cohort else np.zeros(0, dtype=bool)
    accepted = np.concatenate([r.step_accepted for r in cohort]) if cohort else np.zeros(0)
    return WindowSummary(
        window_s=window,
        arrived=arrived,
        completed_in_window=len(done_in_window),
        completion_rate=len(done_in_window) / window,
        output_tokens_per_s=tokens / window,
        goodput=int(_met(done_in_window, slo).sum()) / window,
        goodput_fraction=int(_met(cohort, slo).sum()) / arrived if arrived else 0.0,
        unfinished=arrived - len(cohort),
        ttft=quantiles([r.ttft for r in cohort]),
        tpot=quantiles([r.tpot for r in cohort if r.output_tokens > 1]),
        e2e=quantiles([r.e2e for r in cohort]),
        queue_wait=quantiles([r.queue_wait for r in cohort]),
        mean_executed_k=float(steps_k.mean()) if steps_k.size else 0.0,
        mean_drafted=float(drafted.mean()) if drafted.size else 0.0,
        mean_acceptance_length=1.0 + float(accepted[spec_steps].sum()) / int(spec_steps.sum())
        if spec_steps.any()
        else None,
    )


class SweepPoint(BaseModel):
    model_config = ConfigDict(frozen=True)
    rate: float
    policy: str
    topology: str
    summary: WindowSummary
    preemptions: int


def sweep(
    profile: Profile,
    policies: Sequence[AnyPolicy],
    *,
    rates: Sequence[float],
    duration: float,
    workload: Workload,
    seed: int,
    slo: SloConfig,
    topology: Topology = SINGLE,
    warmup_fraction: float = 0.1,
    drain: float | None = None,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """Open-loop Poisson traffic per rate; every policy sees the same arrivals and requests (common numbers)."""
    points = []
    start = duration * warmup_fraction
    for r_index, rate in enumerate(rates):
        arrivals = poisson_arrivals(rate, duration, seed=seed * 1000 + r_index)
        in_window = int(((arrivals >= start) & (arrivals < duration)).sum())
        for policy in policies:
            requests = make_requests(workload, arrivals, seed=seed * 1000 + r_index + 7)
            core = EngineCore(profile, policy.resolve(topology), seed=seed)
            run = run_open_loop(core, requests, stop_at=duration + (duration if drain is None else drain))
            point = SweepPoint(
                rate=rate,
                policy=policy.label,
                topology=topology.label,
                summary=window_summary(run.records, start=start, end=duration, arrived=in_window, slo=slo),
                preemptions=core.num_preemptions,
            )
            log.info(
                "sweep.point", rate=rate, policy=point.policy, goodput=round(point.summary.goodput, 3),
                engine_steps=core.steps.count,
            )  # fmt: skip
            points.append(point)
            if on_point is not None:
                on_point(point)
    return points
