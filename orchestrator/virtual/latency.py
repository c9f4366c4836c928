"""What users feel, computed from request records (never from a load generator's own statistics)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from loadshapes.slo import SloConfig
from serve_apps.sim.request import RequestRecord


class LatencySummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    p50: float | None
    p99: float | None


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


def percentiles(values: Sequence[float] | np.ndarray) -> LatencySummary:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return LatencySummary(p50=None, p99=None)
    p50, p99 = np.percentile(arr, [50, 99])
    return LatencySummary(p50=float(p50), p99=float(p99))


def summarize_window(
    records: Sequence[RequestRecord], *, start: float, end: float, arrived: int, slo: SloConfig
) -> WindowSummary:
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
        goodput=sum(_good(slo, r) for r in done_in_window) / window,
        goodput_fraction=sum(_good(slo, r) for r in cohort) / arrived if arrived else 0.0,
        unfinished=arrived - len(cohort),
        ttft=percentiles([r.ttft for r in cohort]),
        tpot=percentiles([r.tpot for r in cohort if r.output_tokens > 1]),
        e2e=percentiles([r.e2e for r in cohort]),
        queue_wait=percentiles([r.queue_wait for r in cohort]),
        mean_executed_k=float(steps_k.mean()) if steps_k.size else 0.0,
        mean_drafted=float(drafted.mean()) if drafted.size else 0.0,
        mean_acceptance_length=1.0 + float(accepted[spec_steps].sum()) / int(spec_steps.sum())
        if spec_steps.any()
        else None,
    )


def _good(slo: SloConfig, record: RequestRecord) -> bool:
    # A record is a finished request: completed, with every latency measured.
    return slo.met(record.category, ok=True, ttft_s=record.ttft, tpot_s=record.tpot, e2e_s=record.e2e)
