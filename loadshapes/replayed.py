"""A replayed trace's window: its arrivals read, scaled and binned into phases, and its requests' categories."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, Field

from loadshapes import limits
from loadshapes.phases import Phase
from loadshapes.replay_formats import registry
from loadshapes.replay_formats.base import Arrivals, Format
from loadshapes.trace import filesystem


class CategoryRule(BaseModel):
    """Which mix category a replayed request gets, from what the trace records about it.

    `by: file` matches each key as a substring of the file's name (Azure's `..._code.csv` and `..._conv.csv`);
    `by: model` and `by: log_type` match BurstGPT's `Model` and `Log Type` columns exactly. A value no key matches
    gets `default`, or, without one, the category the mix draws for that request.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    by: Literal["file", "model", "log_type"] = Field(
        description="what to match: the file's name, BurstGPT's `Model`, or its `Log Type`"
    )
    map: dict[str, str] = Field(min_length=1, description="key -> category")
    default: str | None = Field(default=None, description="category for values no key matches; none: the mix draws one")

    def categories(self, values: np.ndarray) -> list[str | None]:
        memo: dict[str, str | None] = {}  # a few distinct values (models, files) over many requests
        out: list[str | None] = []
        for value in (str(v) for v in values):
            if value not in memo:
                if self.by == "file":
                    memo[value] = next((c for key, c in self.map.items() if key in value), self.default)
                else:
                    memo[value] = self.map.get(value, self.default)
            out.append(memo[value])
        return out


_REPLAY_TAIL_S = 1e-6  # the window ends this far after the last arrival, so it lies inside [0, duration)
_REPLAY_MAX_BINS = 100_000
_Stamp = tuple[bool, tuple[tuple[str, int | None, int | None], ...]]


@dataclass(frozen=True)
class Replayed:
    offsets: np.ndarray  # seconds after the replay's start, sorted
    phases: tuple[Phase, ...]
    source: np.ndarray  # request i replays the window's arrival source[i] (an index into `arrivals`)
    copy: np.ndarray  # 0 for the recorded request, 1, 2, ... for the copies rate scaling adds
    arrivals: Arrivals


def _stamp(path: str) -> _Stamp:
    """Whether `path` is a directory, and (path, mtime, size) of its files: a new version means a new stamp."""
    fs, base = filesystem(path)
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.NotFound:
        raise ValueError(f"{path}: no such file or directory")
    is_dir = info.type == pafs.FileType.Directory
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True)) if is_dir else [info]
    return is_dir, tuple(sorted((i.path, i.mtime_ns, i.size) for i in infos if i.type == pafs.FileType.File))


def stamps(paths: tuple[str, ...]) -> tuple[_Stamp, ...]:
    return tuple(_stamp(path) for path in paths)


@functools.lru_cache(maxsize=64)
def detected_format(paths: tuple[str, ...], stamps: tuple[_Stamp, ...]) -> Format:
    formats = [registry.detect_format(path) for path in paths]
    for path, fmt in zip(paths[1:], formats[1:], strict=True):
        if fmt != formats[0]:
            raise ValueError(f"{paths[0]} is {formats[0]} but {path} is {fmt}: the files of one replay share a format")
    return formats[0]


@functools.lru_cache(maxsize=16)
def read_window(
    paths: tuple[str, ...], fmt: Format, column: str | None, arm: str | None, shape: str | None,
    start_s: float, duration_s: float | None, speed: float, rate_scale: float | None, target_rate: float | None,
    seed: int, keep_failed: bool, bin_s: float, stamps: tuple[_Stamp, ...],
) -> Replayed:  # fmt: skip
    name = ", ".join(paths)
    arrivals = registry.read_arrivals(
        paths, fmt, start_s=start_s, duration_s=duration_s, keep_failed=keep_failed, column=column, arm=arm,
        shape=shape,
    )  # fmt: skip
    recorded = (arrivals.ns / 1e9 - start_s) / speed
    end = duration_s / speed if duration_s is not None else float(recorded[-1]) + _REPLAY_TAIL_S
    if end / bin_s > _REPLAY_MAX_BINS:
        raise ValueError(f"{name}: {end:g} s in bins of {bin_s:g} s is over {_REPLAY_MAX_BINS} phases: raise bin_s")
    factor = rate_scale if target_rate is None else target_rate * end / len(recorded)
    planned, most = len(recorded) * (factor or 1.0), limits.current().requests
    if planned > most:  # before the copies are drawn
        raise ValueError(f"{name}: {limits.figure(planned)} requests after scaling by {factor:g}, over the limit of "
                         f"{limits.figure(most)} (limit requests; raise it with "
                         f"{limits.raise_hint('requests', planned)})")  # fmt: skip
    offsets, source, copy = scaled(recorded, end, factor or 1.0, seed)
    if not len(offsets):
        raise ValueError(f"{name}: rate scaling by {factor:g} leaves no request of the {len(recorded)} in the window")
    edges = np.append(np.arange(0.0, end, bin_s), end)
    if len(edges) > 2 and edges[-1] - edges[-2] < bin_s / 2:
        edges = np.delete(edges, -2)  # no sliver of a last bin
    widths = np.diff(edges)
    edges = np.concatenate([[0.0], np.cumsum(widths)])  # exactly the boundaries() the phases give back
    inside = offsets < edges[-1]
    offsets, source, copy = offsets[inside], source[inside], copy[inside]
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
    for array in (offsets, source, copy):
        array.flags.writeable = False
    return Replayed(offsets, phases, source, copy, arrivals)


def scaled(recorded: np.ndarray, end: float, factor: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin (factor < 1) or replicate (> 1) the recorded arrivals: (offsets, source index, copy number).

    Request r is sent floor(factor) times, plus once more with probability frac(factor), so the mean rate scales by
    the factor in every stretch of the trace and a burst stays a burst. A copy lands uniformly in the gap between
    its recorded arrival and the next (the last: the window's end), so the offsets stay in order: request i is the
    same for every worker split.
    """
    n = len(recorded)
    if factor == 1.0:
        return recorded.copy(), np.arange(n), np.zeros(n, np.int64)
    rng = np.random.default_rng([seed, 0x5CA1E])
    whole = math.floor(factor)
    counts = whole + (rng.random(n) < factor - whole).astype(np.int64)
    source = np.repeat(np.arange(n), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    copy = np.arange(len(source)) - first
    within = np.where(copy == 0, 0.0, rng.random(len(source)))
    order = np.lexsort((within, source))  # source is already grouped: copies sorted by where they land
    within = within[order]
    gaps = np.diff(np.append(recorded, max(end, float(recorded[-1]))))
    offsets = recorded[source] + within * gaps[source]
    return offsets, source, copy
