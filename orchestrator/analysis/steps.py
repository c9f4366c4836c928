"""Per engine step, the batch size and the k vLLM reported, as flat arrays over every request's steps.

Most checks need only how often each (arm, batch size, executed k) occurred: one bincount over all steps gives
that histogram, and everything else is arithmetic on a few thousand cells. Steps carry no timestamps of their
own; when a check needs time, a request's steps are spread evenly over its time in the engine (first scheduled
to done), which places them to within one request's duration: fine for switch times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from orchestrator.analysis.clock import RunClock
from orchestrator.analysis.lists import flat_list
from orchestrator.analysis.slices import row_slices


@dataclass(frozen=True)
class Steps:
    batch: np.ndarray  # per step
    k: np.ndarray  # per step, the k executed
    offsets: np.ndarray  # request i's steps are [offsets[i], offsets[i + 1])
    mismatched_requests: int  # step_k and step_batch_size of different lengths: only the common prefix is kept

    @cached_property  # read many times, slice by slice: one diff of the offsets, not one per read
    def lengths(self) -> np.ndarray:
        lengths: np.ndarray = np.diff(self.offsets)
        return lengths


def step_columns(table: pa.Table) -> Steps:
    batches = flat_list(table["step_batch_size"])
    ks = flat_list(table["step_k"])
    common = np.minimum(batches.lengths, ks.lengths)
    mismatched = int((batches.lengths != ks.lengths).sum())
    batch, k = batches.values, ks.values
    if mismatched:
        batch = batch[batches.positions() < np.repeat(common, batches.lengths)]
        k = k[ks.positions() < np.repeat(common, ks.lengths)]
    offsets = np.zeros(len(common) + 1, dtype=np.int64)
    np.cumsum(common, out=offsets[1:])
    return Steps(batch=batch, k=k, offsets=offsets, mismatched_requests=mismatched)


def step_histogram(steps: Steps, row_group: np.ndarray, groups: int, batch_limit: int) -> np.ndarray:
    """(groups, batch_limit + 1, max k + 1) step counts; batch sizes above the limit count at the limit.

    Rows with group -1 are left out.
    """
    k_width = int(steps.k.max(initial=0)) + 1
    cells = groups * (batch_limit + 1) * k_width
    counts = np.zeros(cells, dtype=np.int64)
    # Request slice by request slice: tens of millions of steps would otherwise need full-length code arrays.
    for rows in row_slices(len(row_group)):
        first, last = steps.offsets[rows.start], steps.offsets[rows.stop]
        code = np.repeat(
            np.where(row_group[rows] >= 0, row_group[rows] * (batch_limit + 1) * k_width, -1), steps.lengths[rows]
        )
        kept = code >= 0
        code += np.clip(steps.batch[first:last], 0, batch_limit).astype(np.int64) * k_width
        code += steps.k[first:last]
        counts += np.bincount(code[kept] if not kept.all() else code, minlength=cells)
    histogram: np.ndarray = counts.reshape(groups, batch_limit + 1, k_width)
    return histogram


@dataclass(frozen=True)
class TimedSteps:
    request: np.ndarray  # the row each step belongs to
    batch: np.ndarray
    k: np.ndarray
    time_s: np.ndarray  # offset in the request's run; NaN where the request has no times


def _first_present(table: pa.Table, rows: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """Per row in `rows`, the first of `names` that is set (epoch ns as float, NaN if none)."""
    out = np.full(len(rows), np.nan)
    for name in names:
        if name not in table.column_names:
            continue
        values = table[name].take(pa.array(rows)).to_numpy(zero_copy_only=False).astype(np.float64)
        out = np.where(np.isnan(out), values, out)
    return out


def timed_steps(table: pa.Table, clock: RunClock, steps: Steps, rows: np.ndarray) -> TimedSteps:
    """The steps of `rows` only (sorted row indices), each placed in time within its request."""
    lengths = steps.lengths[rows]
    starts = steps.offsets[rows]
    owner = np.repeat(np.arange(len(rows)), lengths)
    first_of_owner = np.zeros(len(rows), dtype=np.int64)
    np.cumsum(lengths[:-1], out=first_of_owner[1:])
    position = np.arange(len(owner)) - first_of_owner[owner]
    index = starts[owner] + position
    begin = _first_present(table, rows, ("server_first_scheduled_ns", "sent_ns", "scheduled_ns"))
    end = _first_present(table, rows, ("server_done_ns", "done_ns"))
    span = np.where(end >= begin, end - begin, np.nan)
    run_start = clock.start_ns[clock.run[rows]].astype(np.float64)
    fraction = (position + 0.5) / lengths[owner]
    time_s = (begin[owner] - run_start[owner] + span[owner] * fraction) / 1e9
    return TimedSteps(request=rows[owner], batch=steps.batch[index], k=steps.k[index], time_s=time_s)
