"""Offline experiments on the virtual-time simulated engine: fixed batch sizes and open-loop rate sweeps."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from loadshapes.arrivals import poisson_arrivals
from loadshapes.mixes import Workload
from loadshapes.slo import SloConfig
from orchestrator.logs import get_logger
from orchestrator.virtual.latency import WindowSummary, summarize_window
from serve_apps.policies import SINGLE, OffPolicy, Topology
from serve_apps.policies import Policy as PolicyT
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.request import SimRequest
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
        tpot_p50_s=float(np.median(steady)) if steady else float("nan"),
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
                summary=summarize_window(run.records, start=start, end=duration, arrived=in_window, slo=slo),
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
