"""One numpy array per measure, one element per request: what every map and check is computed from.

The list columns are reduced here once (typical batch, executed k, acceptance counts), so the maps never
touch a list again. A request's typical batch is the mean over its steps, not the median: a median needs a sort
of every step (seconds at 10 million requests), the mean one cumulative sum, and the two differ little over a
request's few seconds in the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from loadshapes.shapes import _Shape as ShapeLike
from orchestrator.analysis.clock import Codes, RunClock, RunKey, encode, offered_rates_at, run_clock
from orchestrator.analysis.columns import float_column
from orchestrator.analysis.frame_kernels import clock_seconds_of, mean_of_sums
from orchestrator.analysis.lists import list_sums
from orchestrator.analysis.parallel import run_parallel

FRAME_COLUMNS = (
    "arm",
    "shape",
    "run",
    "request_id",
    "category",
    "scheduled_ns",
    "status",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "queue_wait_s",
    "step_batch_size",
    "step_k",
    "per_step_drafted",
    "per_step_accepted",
)
_LATENCIES = ("ttft_s", "tpot_s", "e2e_s", "queue_wait_s")
# A ramp from zero would let one early request stand for minutes of clock: each request stands for at most
# the gap its run's mean rate would leave, times this.
_MAX_CLOCK_STRETCH = 20.0


@dataclass(frozen=True)
class RequestFrame:
    arm: Codes
    shape: Codes
    category: Codes
    repeat: np.ndarray  # from the request id; -1 when the id does not follow {arm}:{shape}:{repeat}:{index}
    index: np.ndarray
    run: np.ndarray  # which (arm, shape, run, repeat) run the request belongs to
    run_span_s: np.ndarray  # per run: first to last scheduled request
    offset_s: np.ndarray  # scheduled time since its run's start
    ok: np.ndarray  # status == "ok"
    ttft: np.ndarray  # seconds, NaN when missing
    tpot: np.ndarray
    e2e: np.ndarray
    queue_wait: np.ndarray
    typical_batch: np.ndarray  # mean batch size over the request's engine steps; NaN without steps
    steps: np.ndarray  # engine steps the request was in
    k_sum: np.ndarray  # executed k summed over those steps
    spec_steps: np.ndarray  # steps that verified drafts
    accepted: np.ndarray  # draft tokens accepted
    offered_rate: np.ndarray  # req/s offered at the scheduled time; NaN when unknown
    clock_s: np.ndarray  # seconds of the run's clock this request stands for: 1 / offered rate

    def __len__(self) -> int:
        return len(self.ok)


def clock_seconds(clock: RunClock, offered_rate: np.ndarray) -> np.ndarray:
    """Each request stands for 1/rate seconds of its run: summed over a band, the time the band lasted.

    Where the offered rate is unknown (closed loop, no shape given) the run's mean arrival rate stands in.
    """
    mean_rate = np.where(clock.span_s > 0, (clock.rows - 1) / np.where(clock.span_s > 0, clock.span_s, 1.0), np.nan)
    out = np.empty(len(offered_rate), dtype=np.float64)
    clock_seconds_of(
        np.ascontiguousarray(offered_rate, dtype=np.float64),
        np.ascontiguousarray(clock.run, dtype=np.int64),
        mean_rate.astype(np.float64),
        _MAX_CLOCK_STRETCH,
        out,
    )
    return out


def _step_totals(table: pa.Table) -> dict[str, np.ndarray]:
    batch_sums, steps = list_sums(table["step_batch_size"])
    typical_batch = np.empty(len(steps), dtype=np.float64)
    mean_of_sums(batch_sums, steps, typical_batch)
    return {"typical_batch": typical_batch, "steps": steps, "k_sum": list_sums(table["step_k"])[0]}


def _draft_totals(table: pa.Table) -> dict[str, np.ndarray]:
    return {
        "spec_steps": list_sums(table["per_step_drafted"], positive=True)[0],
        "accepted": list_sums(table["per_step_accepted"])[0],
    }


def _outcomes(table: pa.Table) -> dict[str, object]:
    status = encode(table["status"])
    ok_code = status.names.index("ok") if "ok" in status.names else -2
    return {
        "ok": status.codes == ok_code,
        "category": encode(table["category"]),
        **{name.removesuffix("_s"): float_column(table[name]) for name in _LATENCIES},
    }


def request_frame(
    table: pa.Table,
    *,
    shapes: Mapping[str, ShapeLike] | None = None,
    offered_rate: np.ndarray | None = None,
    run_starts: Mapping[RunKey, int] | None = None,
) -> RequestFrame:
    """The offered rate comes from `offered_rate` (per row, computed by the caller) or else from `shapes`."""
    if offered_rate is not None and len(offered_rate) != table.num_rows:
        raise ValueError(f"offered_rate has {len(offered_rate)} values for {table.num_rows} rows")
    clock, steps, drafts, outcomes = run_parallel(
        lambda: run_clock(table, run_starts=run_starts),
        lambda: _step_totals(table),
        lambda: _draft_totals(table),
        lambda: _outcomes(table),
    )
    if offered_rate is None:
        offered_rate = offered_rates_at(clock, shapes) if shapes else np.full(table.num_rows, np.nan)
    rate = np.asarray(offered_rate, dtype=np.float64)
    return RequestFrame(
        arm=clock.arm,
        shape=clock.shape,
        repeat=clock.ids.repeat,
        index=clock.ids.index,
        run=clock.run,
        run_span_s=clock.span_s,
        offset_s=clock.offset_s,
        offered_rate=rate,
        clock_s=clock_seconds(clock, rate),
        **steps,
        **drafts,
        **outcomes,
    )
