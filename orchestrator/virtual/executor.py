"""The virtual-time executor of the unit loop (orchestrator.execute.runner): a unit's traffic played into its arm's
simulated engines, written as the run directory `orchestrator.execute.ray_executor` writes
(orchestrator.rundir.layout), so the report reads both.

Virtual time is anchored at a fixed epoch, with every unit in its own slot after it (the arms one after the
other, as a real run deploys them), so the same campaign gives the same traces on every machine and resumes
into the same slots.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import pyarrow as pa

from loadshapes.plan import WorkerPlan
from loadshapes.trace import PartWriter, writer_id
from orchestrator.execute.runner import Work
from orchestrator.logs import get_logger
from orchestrator.plan.campaign import Campaign
from orchestrator.rundir.layout import RunStore, Unit, UnitResult
from orchestrator.rundir.manifest import arm_entry, plans_for, units_of
from orchestrator.rundir.unit_files import unit_tpot_p50, write_timeline
from orchestrator.rundir.worker_summary import WorkerSummary
from orchestrator.virtual.arrays import to_ns
from orchestrator.virtual.rows import RowContext, trace_table
from orchestrator.virtual.traffic import Traffic, UnitRun, play, traffic_of
from orchestrator.virtual.twins import NODE_ID, ArmModel, VirtualEngine, arm_model
from serve_apps.arms import ArmSpec

log = get_logger(__name__)

VIRTUAL_EPOCH_NS = 1_735_689_600 * 10**9  # 2025-01-01T00:00:00Z: fixed, so traces do not depend on the wall clock
UNIT_GAP_S = 60  # between unit slots (a real run spends it on collection, teardown, the next deploy and warm-up)


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
            data[name] = (to_ns(start_ns, seconds) / 1e9).tolist()
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


def slot_ns(campaign: Campaign, shape: str) -> int:
    """A unit's slot in virtual time: its shape, the drain after it, and the gap to the next unit."""
    return (math.ceil(campaign.shapes[shape].duration + campaign.load.drain_s) + UNIT_GAP_S) * 10**9


def unit_starts(campaign: Campaign) -> dict[str, int]:
    """Each unit's slot in virtual time: the arms in order, each unit after the previous one's drain."""
    starts: dict[str, int] = {}
    t = VIRTUAL_EPOCH_NS
    for arm in campaign.arms():
        for unit in units_of(campaign, arm):
            starts[unit.key] = t
            t += slot_ns(campaign, unit.shape)
    return starts


def play_unit(
    campaign: Campaign, model: ArmModel, unit: Unit, plans: Sequence[WorkerPlan], traffic: Traffic, *, run: str,
    start_ns: int, stored: bool = True,
) -> tuple[UnitRun, pa.Table]:  # fmt: skip
    """A unit's traffic played into its arm's engines, and its trace rows: what a virtual unit writes, and what
    `tune` and `search` score in memory (stored=False: without the columns only a stored trace needs)."""
    shape = campaign.shapes[unit.shape]
    outcome = play(model, unit, plans, traffic, campaign.load.drain_s, open_loop=shape.open_loop)
    ctx = RowContext.of(campaign, model.arm, unit.shape, unit.repeat, run=run, start_ns=start_ns,
                        time_scale=model.time_scale, stored=stored)  # fmt: skip
    return outcome, trace_table(ctx, outcome, model.engines)


def simulate_unit(
    campaign: Campaign, model: ArmModel, unit: Unit, *, run: str, store: RunStore, start_ns: int,
    traffic: Traffic | None = None,
) -> UnitResult:  # fmt: skip
    """One (arm, shape, repeat): simulate, then write its rows and timeline (the marker is the runner's)."""
    arm = model.arm
    began = time.perf_counter()
    plans = plans_for(campaign, arm, unit, run=run, url=f"virtual://{arm.name}", traces=store.traces)
    shape = campaign.shapes[unit.shape]
    outcome, table = play_unit(campaign, model, unit, plans, traffic or Traffic(plans), run=run, start_ns=start_ns)
    simulated = time.perf_counter()
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
    log.info(
        "unit.simulated", unit=unit.key, rows=result.rows, steps=steps, simulate_s=round(simulated - began, 3),
        write_s=round(time.perf_counter() - simulated, 3),
    )  # fmt: skip
    return result


class VirtualExecutor:
    """Units in virtual time. `starts`: each unit's fixed slot (unit_starts, a campaign's units known ahead);
    None: each unit in the slot after the previous one (a search, whose next unit depends on the last)."""

    def __init__(self, starts: dict[str, int] | None = None) -> None:
        self.starts = starts
        self.clock = VIRTUAL_EPOCH_NS
        self.models: dict[str, ArmModel] = {}
        self.traffic: tuple[tuple[str, int], Traffic] | None = None  # the last (shape, repeat)'s requests

    def session(self) -> nullcontext[None]:
        return nullcontext()

    @contextmanager
    def arms_up(self, campaign: Campaign, arms: Sequence[ArmSpec], manifest: dict[str, Any]) -> Iterator[None]:
        for arm in arms:
            self.models[arm.name] = arm_model(arm)
            manifest["arms"][arm.name] = arm_entry(arm, f"virtual://{arm.name}", self.models[arm.name].engines[0].info)
        yield

    def run_unit(self, work: Work, *, run: str, store: RunStore) -> UnitResult:
        campaign, unit = work.campaign, work.unit
        key = (unit.shape, unit.repeat)
        if self.traffic is None or self.traffic[0] != key:  # one set of requests, played to every arm
            self.traffic = (key, traffic_of(campaign, work.arm, unit, run=run, traces=store.traces))
        if self.starts is not None:
            start_ns = self.starts[unit.key]
        else:
            start_ns = self.clock
            self.clock += slot_ns(campaign, unit.shape)
        return simulate_unit(campaign, self.models[unit.arm], unit, run=run, store=store, start_ns=start_ns,
                             traffic=self.traffic[1])  # fmt: skip
