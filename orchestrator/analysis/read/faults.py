"""Fault windows: stretches of a unit where requests failed (a replica died, an endpoint refused, a stream broke).

A request's time here is when its outcome was known (done, or scheduled when it never got that far), so the
requests in flight when a replica died land at the moment it died, not when they were sent. Errors closer than
`gap_s` to each other belong to one window; the window also counts every request that ended inside it, so a
reader sees "7 of 40 failed", not only "7 failed".
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.read.source import Requests

FAULT_COLUMNS = ("arm", "shape", "repeat", "scheduled_ns", "done_ns", "status", "error_class")


def fault_windows_of(requests: Requests, unit_starts: dict[str, int], *, gap_s: float = 2.0) -> list[FaultWindow]:
    """fault_windows over a run's views: the failed rows (few), then, one unit at a time, the outcome times of
    the units they belong to (one integer per row, let go before the next unit), never the rows themselves."""
    columns = ", ".join(FAULT_COLUMNS)
    failed = requests.con.sql(f"SELECT {columns} FROM trace WHERE status <> 'ok'").to_arrow_table()
    if failed.num_rows == 0:
        return []
    keys = unit_keys(failed)
    windows: list[FaultWindow] = []
    units = failed.group_by(["arm", "shape", "repeat"]).aggregate([]).to_pylist()  # from the rows in hand
    for arm, shape, repeat in ((u["arm"], u["shape"], u["repeat"]) for u in units):
        unit = f"{arm}/{shape}/r{repeat}"
        times = requests.con.execute(
            "SELECT coalesce(done_ns, scheduled_ns) AS t FROM trace WHERE arm = ? AND shape = ? AND repeat = ?",
            [arm, shape, repeat],
        ).fetchnumpy()["t"]
        mine = failed.filter(pa.array(keys == unit))
        # Sorted here: numpy's sort of one unit's integers is several times quicker than DuckDB's ORDER BY.
        windows += fault_windows(mine, {unit: np.sort(np.asarray(times, dtype=np.int64))}, unit_starts, gap_s=gap_s)
    return sorted(windows, key=lambda w: w.unit)


class FaultWindow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    unit: str  # arm/shape/rN
    start_s: float  # from the unit's start
    end_s: float
    failed: int
    ended: int  # every request whose outcome was known inside the window, failed or not
    by_class: dict[str, int]

    @property
    def message(self) -> str:
        classes = ", ".join(f"{name} {count}" for name, count in sorted(self.by_class.items()))
        if set(self.by_class) == {"drain_timeout"}:
            # Cancelled when the load worker stopped after its drain: not a fault of the arm, and one moment.
            when = f"at {self.start_s:.1f} s" if f"{self.start_s:.1f}" == f"{self.end_s:.1f}" else (
                f"between {self.start_s:.1f} s and {self.end_s:.1f} s")  # fmt: skip
            cancelled = f"{self.failed} of {self.ended} requests still in flight cancelled"
            return f"{self.unit}: drain timeout {when}: {cancelled}"
        return (
            f"{self.unit}: {self.failed} of {self.ended} requests failed between {self.start_s:.1f} s and "
            f"{self.end_s:.1f} s ({classes})"
        )


def outcome_ns(table: pa.Table) -> np.ndarray:
    times = pc.coalesce(table["done_ns"], table["scheduled_ns"]).to_numpy(zero_copy_only=False)
    return np.asarray(times, dtype=np.int64)


def _unit_codes(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """Per row, a code into the run's unit names (arm/shape/rN; the repeat from the trace's `repeat` column, or
    from a request id {arm}:{shape}:{repeat}:{i}): Arrow dictionary-encodes the keys, so no row becomes a
    Python object."""
    if "repeat" in table.column_names:
        repeat = pc.cast(table["repeat"], pa.string())
    else:
        repeat = pc.list_element(pc.split_pattern(table["request_id"], ":"), 2)
    arm, shape = pc.cast(table["arm"], pa.string()), pc.cast(table["shape"], pa.string())
    keys = pc.binary_join_element_wise(arm, shape, pc.binary_join_element_wise("r", repeat, ""), "/")
    encoded = pc.dictionary_encode(keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys)
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64), encoded.dictionary.to_pylist()


def unit_keys(table: pa.Table) -> np.ndarray:
    """arm/shape/rN per row."""
    codes, names = _unit_codes(table)
    keys: np.ndarray = np.asarray(names, dtype=object)[codes]
    return keys


def outcomes_by_unit(table: pa.Table) -> dict[str, np.ndarray]:
    """Per unit, the sorted outcome times of its rows (the "N of M failed" denominators)."""
    codes, names = _unit_codes(table)
    times = outcome_ns(table)
    order = np.lexsort((times, codes))
    bounds = np.cumsum(np.bincount(codes, minlength=len(names)))[:-1]
    return dict(zip(names, np.split(times[order], bounds), strict=True))


def fault_windows(
    failed: pa.Table, ended_ns: dict[str, np.ndarray], unit_starts: dict[str, int], *, gap_s: float = 2.0
) -> list[FaultWindow]:
    """`failed`: the rows whose status is not ok (FAULT_COLUMNS); `ended_ns`: per unit, the outcome times of all
    its rows, sorted; `unit_starts`: per unit, its start (epoch ns)."""
    if failed.num_rows == 0:
        return []
    units = unit_keys(failed)
    times = outcome_ns(failed)
    classes = np.asarray(
        pc.coalesce(pc.cast(failed["error_class"], pa.string()), pc.cast(failed["status"], pa.string())).to_pylist(),
        dtype=object,
    )
    windows: list[FaultWindow] = []
    for unit in sorted(set(units)):
        mine = units == unit
        order = np.argsort(times[mine], kind="stable")
        t, c = times[mine][order], classes[mine][order]
        cuts = np.flatnonzero(np.diff(t) > gap_s * 1e9) + 1
        start = unit_starts.get(unit, int(t[0]))
        everything = ended_ns.get(unit, t)
        for first, last in zip(np.r_[0, cuts], np.r_[cuts, len(t)], strict=True):
            low, high = int(t[first]), int(t[last - 1])
            ended = int(np.searchsorted(everything, high, "right") - np.searchsorted(everything, low, "left"))
            windows.append(
                FaultWindow(
                    unit=unit,
                    start_s=(low - start) / 1e9,
                    end_s=(high - start) / 1e9,
                    failed=int(last - first),
                    ended=max(ended, int(last - first)),
                    by_class=dict(Counter(str(x) for x in c[first:last])),
                )
            )
    return windows
