"""Load shapes: the arrival RATE over time (open loop), as named phases the report can find again.

A shape is data (pydantic) that expands into phases, each a linear rate segment `rate_start -> rate_end` over
`duration` seconds. Arrival times come from `arrivals(shape, ...)` (arrivals.py), computed ahead of the run.
`concurrency` is the one closed-loop shape (N users, each sending when its previous request ends) and says so.
`replay` takes its arrival times from a file (a CSV of timestamps or a previous run's trace) instead of a rate.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import posixpath
from typing import Annotated, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, Field, model_validator

from loadshapes.trace import PARTITION_COLUMNS, _filesystem, read_traces


class Phase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    duration: float = Field(gt=0)
    rate_start: float = Field(ge=0)
    rate_end: float = Field(ge=0)

    @property
    def expected_requests(self) -> float:
        return 0.5 * (self.rate_start + self.rate_end) * self.duration


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str
    open_loop: bool = True

    def phases(self) -> list[Phase]:  # pragma: no cover - every shape overrides
        raise NotImplementedError

    @property
    def duration(self) -> float:
        return sum(p.duration for p in self.phases())

    @property
    def expected_requests(self) -> float:
        return sum(p.expected_requests for p in self.phases())

    def boundaries(self) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum([p.duration for p in self.phases()])])

    def rate_at(self, t: float | np.ndarray) -> np.ndarray:
        """Requests per second at offset t (0 outside the shape)."""
        times = np.asarray(t, dtype=np.float64)
        edges = self.boundaries()
        phases = self.phases()
        index = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, len(phases) - 1)
        start = np.array([p.rate_start for p in phases])[index]
        end = np.array([p.rate_end for p in phases])[index]
        frac = (times - edges[index]) / np.array([p.duration for p in phases])[index]
        inside = (times >= 0) & (times < edges[-1])
        return np.where(inside, start + (end - start) * frac, 0.0)

    def cumulative(self, t: float | np.ndarray) -> np.ndarray:
        """Expected arrivals in [0, t): the integral of rate, exact for linear segments."""
        times = np.clip(np.asarray(t, dtype=np.float64), 0.0, self.duration)
        edges = self.boundaries()
        phases = self.phases()
        before = np.concatenate([[0.0], np.cumsum([p.expected_requests for p in phases])])
        index = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, len(phases) - 1)
        r0 = np.array([p.rate_start for p in phases])[index]
        r1 = np.array([p.rate_end for p in phases])[index]
        d = np.array([p.duration for p in phases])[index]
        x = times - edges[index]
        expected: np.ndarray = before[index] + r0 * x + 0.5 * (r1 - r0) / d * x * x
        return expected

    def phase_at(self, t: float | np.ndarray) -> np.ndarray:
        """Phase name for each offset (the last phase for t at the very end)."""
        names = np.array([p.name for p in self.phases()])
        edges = self.boundaries()
        index = np.clip(np.searchsorted(edges, np.asarray(t, dtype=np.float64), side="right") - 1, 0, len(names) - 1)
        picked: np.ndarray = names[index]
        return picked


class Quiet(_Shape):
    kind: Literal["quiet"] = "quiet"
    rate: float = Field(gt=0)
    duration_s: float = Field(gt=0)

    def phases(self) -> list[Phase]:
        return [Phase(name="quiet", duration=self.duration_s, rate_start=self.rate, rate_end=self.rate)]


class Ramp(_Shape):
    kind: Literal["ramp"] = "ramp"
    rate_from: float = Field(ge=0)
    rate_to: float = Field(ge=0)
    duration_s: float = Field(gt=0)

    def phases(self) -> list[Phase]:
        return [Phase(name="ramp", duration=self.duration_s, rate_start=self.rate_from, rate_end=self.rate_to)]


class Sustained(_Shape):
    kind: Literal["sustained"] = "sustained"
    rate: float = Field(gt=0)
    duration_s: float = Field(gt=0)

    def phases(self) -> list[Phase]:
        return [Phase(name="sustained", duration=self.duration_s, rate_start=self.rate, rate_end=self.rate)]


class Step(_Shape):
    kind: Literal["step"] = "step"
    rates: list[float] = Field(min_length=1)
    step_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _positive(self) -> Step:
        for i, r in enumerate(self.rates):
            if r < 0:
                raise ValueError(f"rates[{i}] = {r} must be >= 0")
        return self

    def phases(self) -> list[Phase]:
        return [
            Phase(name=f"step{i}", duration=self.step_s, rate_start=r, rate_end=r) for i, r in enumerate(self.rates)
        ]


class CrossAndRecover(_Shape):
    """Quiet, rise past a named load boundary, hold above it, fall back below, quiet again."""

    kind: Literal["cross_and_recover"] = "cross_and_recover"
    quiet_rate: float = Field(gt=0)
    peak_rate: float = Field(gt=0)
    boundary_rate: float = Field(gt=0)
    boundary: str = "boundary"
    quiet_s: float = Field(gt=0)
    rise_s: float = Field(gt=0)
    hold_s: float = Field(gt=0)
    fall_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _crosses(self) -> CrossAndRecover:
        if not self.quiet_rate < self.boundary_rate < self.peak_rate:
            raise ValueError(
                f"quiet_rate {self.quiet_rate} < boundary_rate {self.boundary_rate} < peak_rate {self.peak_rate} "
                "must hold for the load to cross the boundary"
            )
        return self

    def crossing_offsets(self) -> tuple[float, float]:
        """When the rate passes the boundary on the way up and on the way down."""
        up = self.quiet_s + self.rise_s * (self.boundary_rate - self.quiet_rate) / (self.peak_rate - self.quiet_rate)
        down_start = self.quiet_s + self.rise_s + self.hold_s
        down = down_start + self.fall_s * (self.peak_rate - self.boundary_rate) / (self.peak_rate - self.quiet_rate)
        return up, down

    def phases(self) -> list[Phase]:
        q, p = self.quiet_rate, self.peak_rate
        b = self.boundary
        return [
            Phase(name="quiet_before", duration=self.quiet_s, rate_start=q, rate_end=q),
            Phase(name=f"rise_past_{b}", duration=self.rise_s, rate_start=q, rate_end=p),
            Phase(name=f"above_{b}", duration=self.hold_s, rate_start=p, rate_end=p),
            Phase(name=f"fall_below_{b}", duration=self.fall_s, rate_start=p, rate_end=q),
            Phase(name="quiet_after", duration=self.quiet_s, rate_start=q, rate_end=q),
        ]


class Day(_Shape):
    """A diurnal curve (trough at the start, peak half way) compressed into `duration_s`, in `segments` pieces."""

    kind: Literal["day"] = "day"
    min_rate: float = Field(ge=0)
    max_rate: float = Field(gt=0)
    duration_s: float = Field(gt=0)
    segments: int = Field(default=48, ge=4, le=10_000)

    def phases(self) -> list[Phase]:
        seg = self.duration_s / self.segments
        mid, amp = (self.max_rate + self.min_rate) / 2, (self.max_rate - self.min_rate) / 2

        def r(i: int) -> float:
            return mid - amp * math.cos(2 * math.pi * i / self.segments)

        return [
            Phase(name=f"hour{int(24 * i / self.segments):02d}", duration=seg, rate_start=r(i), rate_end=r(i + 1))
            for i in range(self.segments)
        ]


class Concurrency(_Shape):
    """CLOSED LOOP: `users` users, each sending its next request when the previous one ends."""

    kind: Literal["concurrency"] = "concurrency"
    open_loop: bool = False
    users: int = Field(ge=1)
    duration_s: float = Field(gt=0)

    def phases(self) -> list[Phase]:
        # No arrival rate exists in closed loop; the phase only names the period.
        return [Phase(name=f"closed_loop_{self.users}_users", duration=self.duration_s, rate_start=0, rate_end=0)]


class Replay(_Shape):
    """Arrivals replayed from a file: a CSV of timestamps in seconds, or a trace's `scheduled_ns` (file or directory).

    Offsets start at 0 (absolute or relative times alike), sorted, divided by `speed`. `duration_s` cuts or extends
    the window, else it ends just after the last arrival. Phases are `bin_s` bins of constant rate.
    """

    kind: Literal["replay"] = "replay"
    path: str = Field(min_length=1)
    format: Literal["csv", "parquet"] | None = None  # None: by extension; a directory is a trace
    column: str | None = None  # CSV only: read this column of a CSV with a header
    arm: str | None = None  # trace only: the arm and shape partition to replay
    shape: str | None = None
    speed: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    duration_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    bin_s: float = Field(default=1.0, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _readable(self) -> Replay:
        self.offsets()
        return self

    def offsets(self) -> np.ndarray:
        """The replayed send offsets, sorted (read-only; cached per file version)."""
        return _replayed(self, _stamp(self.path))[0]

    def phases(self) -> list[Phase]:
        return list(_replayed(self, _stamp(self.path))[1])

    @property
    def expected_requests(self) -> float:
        return float(len(self.offsets()))


_REPLAY_TAIL_S = 1e-6  # the window ends this far after the last arrival, so it lies inside [0, duration)
_REPLAY_MAX_BINS = 100_000
_Stamp = tuple[bool, tuple[tuple[str, int | None, int | None], ...]]


def _stamp(path: str) -> _Stamp:
    """Whether `path` is a directory, and (path, mtime, size) of its files: a new version means a new stamp."""
    fs, base = _filesystem(path)
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.NotFound:
        raise ValueError(f"{path}: no such file or directory")
    is_dir = info.type == pafs.FileType.Directory
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True)) if is_dir else [info]
    return is_dir, tuple(sorted((i.path, i.mtime_ns, i.size) for i in infos if i.type == pafs.FileType.File))


@functools.lru_cache(maxsize=16)
def _replayed(replay: Replay, stamp: _Stamp) -> tuple[np.ndarray, tuple[Phase, ...]]:
    seconds = _read_seconds(replay.path, replay.format, replay.column, replay.arm, replay.shape, stamp)
    offsets = seconds / replay.speed
    end = replay.duration_s or float(offsets[-1]) + _REPLAY_TAIL_S
    if end / replay.bin_s > _REPLAY_MAX_BINS:
        raise ValueError(
            f"{replay.path}: {end:g} s in bins of {replay.bin_s:g} s is over {_REPLAY_MAX_BINS} phases: raise bin_s"
        )
    edges = np.append(np.arange(0.0, end, replay.bin_s), end)
    if len(edges) > 2 and edges[-1] - edges[-2] < replay.bin_s / 2:
        edges = np.delete(edges, -2)  # no sliver of a last bin
    widths = np.diff(edges)
    edges = np.concatenate([[0.0], np.cumsum(widths)])  # exactly the boundaries() the phases give back
    offsets = offsets[offsets < edges[-1]]  # never empty: the first arrival is at 0
    counts = np.diff(np.searchsorted(offsets, edges, side="left"))
    digits = max(2, len(str(len(widths) - 1)))
    phases = tuple(
        Phase(
            name="replay" if len(widths) == 1 else f"replay{i:0{digits}d}",
            duration=float(w),
            rate_start=float(c / w),
            rate_end=float(c / w),
        )
        for i, (w, c) in enumerate(zip(widths, counts, strict=True))
    )
    offsets.flags.writeable = False
    return offsets, phases


@functools.lru_cache(maxsize=16)
def _read_seconds(
    path: str, fmt: str | None, column: str | None, arm: str | None, shape: str | None, stamp: _Stamp
) -> np.ndarray:
    """Arrival times in seconds from the first, sorted."""
    is_dir = stamp[0]
    suffix = posixpath.splitext(path.rstrip("/"))[1].lower()
    fmt = fmt or ("parquet" if is_dir or suffix == ".parquet" else "csv" if suffix == ".csv" else None)
    if fmt is None:
        raise ValueError(f"{path}: cannot tell the format: name it .csv or .parquet, or set format")
    if fmt == "csv":
        if is_dir:
            raise ValueError(f"{path}: a directory, not a CSV file")
        if arm is not None or shape is not None:
            raise ValueError(f"{path}: arm and shape pick from a trace, not a CSV")
        fs, base = _filesystem(path)
        with fs.open_input_stream(base) as stream:
            seconds = _csv_seconds(path, stream.read().decode("utf-8-sig"), column)
    else:
        if column is not None:
            raise ValueError(f"{path}: column names a CSV column; a trace replays scheduled_ns")
        seconds = _trace_seconds(path, arm, shape)
    seconds = np.sort(seconds)
    seconds -= seconds[0]
    seconds.flags.writeable = False
    return seconds


def _csv_seconds(path: str, text: str, column: str | None) -> np.ndarray:
    reader = csv.reader(io.StringIO(text))
    need_header, index, width = column is not None, 0, 1
    values: list[float] = []
    for row in reader:
        cells = [c.strip() for c in row]
        if not any(cells):
            continue
        where = f"{path}:{reader.line_num}"
        if need_header:
            if column not in cells:
                raise ValueError(f"{where}: no column {column!r} in the header ({', '.join(cells)})")
            need_header, index, width = False, cells.index(column), len(cells)
            continue
        if len(cells) != width:
            hint = "" if column else "; name the column to read with column"
            raise ValueError(f"{where}: expected {width} fields, got {len(cells)}{hint}")
        try:
            value = float(cells[index])
        except ValueError:
            hint = " (a header? name the column with column)" if column is None and not values else ""
            raise ValueError(f"{where}: {cells[index]!r} is not a number{hint}") from None
        if not math.isfinite(value):
            raise ValueError(f"{where}: {cells[index]!r} is not a finite number")
        if value < 0:
            raise ValueError(f"{where}: {cells[index]!r} is negative")
        values.append(value)
    if need_header:
        raise ValueError(f"{path}: empty, expected a header naming {column!r}")
    if not values:
        raise ValueError(f"{path}: no arrivals")
    return np.array(values, dtype=np.float64)


def _trace_seconds(path: str, arm: str | None, shape: str | None) -> np.ndarray:
    try:
        table = read_traces(path, columns=["scheduled_ns", *PARTITION_COLUMNS])
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a readable trace: {e}") from None
    for name, wanted in (("arm", arm), ("shape", shape)):
        if wanted is not None:
            table = table.filter(pc.equal(table[name], wanted))
    groups = table.group_by(list(PARTITION_COLUMNS)).aggregate([]).to_pylist()
    pairs = sorted(f"{g['arm']}/{g['shape']}" for g in groups)
    if not pairs:
        raise ValueError(f"{path}: no trace rows for arm={arm!r} shape={shape!r}")
    if len(pairs) > 1:
        raise ValueError(f"{path}: {len(pairs)} arm/shape pairs ({', '.join(pairs)}): pick one with arm and shape")
    scheduled = table["scheduled_ns"]
    if scheduled.null_count:
        raise ValueError(f"{path}: {scheduled.null_count} rows without scheduled_ns")
    ns = scheduled.to_numpy().astype(np.int64)
    seconds: np.ndarray = (ns - ns.min()) / 1e9
    return seconds


Shape = Annotated[
    Quiet | Ramp | Sustained | Step | CrossAndRecover | Day | Concurrency | Replay, Field(discriminator="kind")
]
