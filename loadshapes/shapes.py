"""Load shapes: the arrival RATE over time (open loop), as named phases the report can find again.

A shape is data (pydantic) that expands into phases, each a linear rate segment `rate_start -> rate_end` over
`duration` seconds. Arrival times come from `arrivals(shape, ...)` (arrivals.py), computed ahead of the run.
`concurrency` is the one closed-loop shape (N users, each sending when its previous request ends) and says so.
`replay` takes its arrival times, and request lengths where the trace has them, from a file (replay_formats/).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from loadshapes.campaign_files import anchored, reads_files
from loadshapes.mixes import ReplayedRequests
from loadshapes.phases import Phase
from loadshapes.prompts import PrefixBlocks
from loadshapes.replay_formats import registry
from loadshapes.replay_formats.base import Format
from loadshapes.replayed import CategoryRule, Replayed, detected_format, read_window, stamps


class ShapeBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str
    open_loop: bool = Field(default=True, description="false only for `concurrency` (closed loop); not meant to be set")

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


class Quiet(ShapeBase):
    kind: Literal["quiet"] = "quiet"
    rate: float = Field(gt=0, description="requests per second")
    duration_s: float = Field(gt=0)

    def phases(self) -> list[Phase]:
        return [Phase(name="quiet", duration=self.duration_s, rate_start=self.rate, rate_end=self.rate)]


class Ramp(ShapeBase):
    kind: Literal["ramp"] = "ramp"
    rate_from: float = Field(
        ge=0, description="requests per second at the start, rising (or falling) linearly to `rate_to`"
    )
    rate_to: float = Field(ge=0, description="requests per second at the end")
    duration_s: float = Field(gt=0)

    def phases(self) -> list[Phase]:
        return [Phase(name="ramp", duration=self.duration_s, rate_start=self.rate_from, rate_end=self.rate_to)]


class Sustained(ShapeBase):
    kind: Literal["sustained"] = "sustained"
    rate: float = Field(gt=0, description="requests per second")
    duration_s: float = Field(gt=0)

    def phases(self) -> list[Phase]:
        return [Phase(name="sustained", duration=self.duration_s, rate_start=self.rate, rate_end=self.rate)]


class Step(ShapeBase):
    kind: Literal["step"] = "step"
    rates: list[float] = Field(min_length=1, description="requests per second of each step, `step_s` seconds each")
    step_s: float = Field(gt=0, description="seconds per step")

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


class CrossAndRecover(ShapeBase):
    """Quiet, rise past a named load boundary, hold above it, fall back below, quiet again."""

    kind: Literal["cross_and_recover"] = "cross_and_recover"
    quiet_rate: float = Field(gt=0, description="requests per second before and after")
    peak_rate: float = Field(gt=0, description="requests per second held above the boundary")
    boundary_rate: float = Field(
        gt=0, description="the rate that crosses the boundary (quiet_rate < boundary_rate < peak_rate)"
    )
    boundary: str = Field(
        default="boundary", description="names the phases (`rise_past_<boundary>`, `above_<boundary>`, ...)"
    )
    quiet_s: float = Field(gt=0, description="seconds of quiet before the rise and after the fall")
    rise_s: float = Field(gt=0, description="seconds rising from quiet_rate to peak_rate")
    hold_s: float = Field(gt=0, description="seconds at peak_rate")
    fall_s: float = Field(gt=0, description="seconds falling back to quiet_rate")

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


class Day(ShapeBase):
    """A diurnal curve (trough at the start, peak half way) compressed into `duration_s`, in `segments` pieces."""

    kind: Literal["day"] = "day"
    min_rate: float = Field(ge=0, description="requests per second at the trough")
    max_rate: float = Field(gt=0, description="requests per second at the peak")
    duration_s: float = Field(gt=0)
    segments: int = Field(
        default=48, ge=4, le=10_000, description="linear pieces the curve is drawn with (phases `hour00` ...)"
    )

    def phases(self) -> list[Phase]:
        seg = self.duration_s / self.segments
        mid, amp = (self.max_rate + self.min_rate) / 2, (self.max_rate - self.min_rate) / 2

        def r(i: int) -> float:
            return mid - amp * math.cos(2 * math.pi * i / self.segments)

        return [
            Phase(name=f"hour{int(24 * i / self.segments):02d}", duration=seg, rate_start=r(i), rate_end=r(i + 1))
            for i in range(self.segments)
        ]


class Concurrency(ShapeBase):
    """CLOSED LOOP: `users` users, each sending its next request when the previous one ends."""

    kind: Literal["concurrency"] = "concurrency"
    open_loop: bool = Field(
        default=False, description="false only for `concurrency` (closed loop); not meant to be set"
    )
    users: int = Field(ge=1, description="closed-loop users, each sending its next request when the previous one ends")
    duration_s: float = Field(gt=0)

    def phases(self) -> list[Phase]:
        # No arrival rate exists in closed loop; the phase only names the period.
        return [Phase(name=f"closed_loop_{self.users}_users", duration=self.duration_s, rate_start=0, rate_end=0)]


class Replay(ShapeBase):
    """Arrivals, and where the trace records them request lengths, replayed from a file (loadshapes/replay_formats/).

    `start_s` / `duration_s` cut a window of the trace's own seconds (from its first request); offsets start at the
    window's start, divided by `speed`. `rate_scale` (a factor) or `target_rate` (mean requests per second of the
    replay) thins or replicates requests, seeded by `seed`, keeping the burst structure: each request is kept, or
    copied, independently, and a copy lands in the gap before the next recorded arrival. Without `duration_s` the
    window ends just after the last arrival. Phases are `bin_s` bins of constant rate.
    """

    kind: Literal["replay"] = "replay"
    # One file, or several of one format replayed as one trace merged by time (Azure's code and conversation files);
    # a relative path is read from the campaign file's directory.
    path: str | tuple[str, ...] = Field(min_length=1)
    # None: from the path and the header (replay_formats.registry); parquet is the older name of specdrill.
    format: Literal["azure", "burstgpt", "mooncake", "specdrill", "csv", "parquet"] | None = None
    column: str | None = None  # csv only: read this column of a CSV with a header
    arm: str | None = None  # specdrill only: the arm and shape partition to replay
    shape: str | None = Field(default=None, description="specdrill only: with `arm`, the partition to replay")
    start_s: float = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        description="window start, in the trace's seconds from its first request",
    )
    duration_s: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="window length; default: to just after the last arrival"
    )
    speed: float = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="offsets are divided by this (2 replays twice as fast)"
    )
    rate_scale: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="thin (< 1) or replicate (> 1) requests, seeded, keeping the bursts",
    )
    target_rate: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="the same, to this mean rate (requests per second); give one of the two",
    )
    seed: int = Field(default=0, ge=0)  # thinning and replication only: the recorded arrivals are not random
    # Traces with lengths (azure, burstgpt, mooncake): the category of each request, its prompt's generator.
    category: str | CategoryRule | None = None  # None: the mix draws it, as for any shape
    failed: Literal["skip", "expect_error"] = "skip"  # BurstGPT's failed requests (0 response tokens)
    failed_category: str = Field(
        default="failed", min_length=1, description="category of failed requests kept with `failed: expect_error`"
    )
    block_tokens: int = Field(default=512, ge=1)  # Mooncake: tokens per hash_ids block (512 in its release)
    max_prompt_tokens: int | None = Field(default=None, ge=1)  # clip recorded lengths (an arm's max_model_len)
    max_output_tokens: int | None = Field(default=None, ge=1, description="clip recorded output lengths")
    bin_s: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description="phase length: phases are `replay00`, `replay01`, ... bins of this many seconds",
    )

    @field_validator("path", mode="after")
    @classmethod
    def _relative_to_the_campaign(cls, v: str | tuple[str, ...], info: ValidationInfo) -> str | tuple[str, ...]:
        return anchored(v, info) if isinstance(v, str) else tuple(anchored(p, info) for p in v)

    @model_validator(mode="after")
    def _readable(self, info: ValidationInfo) -> Replay:
        if self.rate_scale is not None and self.target_rate is not None:
            raise ValueError("rate_scale and target_rate both scale the rate: give one")
        if not reads_files(info):  # a run's record: its trace was read when the run started
            return self
        fmt = self.trace_format
        with_lengths = registry.FORMATS[fmt].has_lengths
        lengths_only = {
            "category": self.category is not None,
            "max_prompt_tokens": self.max_prompt_tokens is not None,
            "max_output_tokens": self.max_output_tokens is not None,
        }
        for name, given in lengths_only.items():
            if given and not with_lengths:
                raise ValueError(f"{self.label}: {name} applies to traces with request lengths "
                                 f"(azure, burstgpt, mooncake), not {fmt}")  # fmt: skip
        if self.failed != "skip" and fmt != "burstgpt":
            raise ValueError(f"{self.label}: failed applies to BurstGPT traces (0 response tokens), not {fmt}")
        if isinstance(self.category, CategoryRule) and self.category.by not in registry.RULE_KEYS[fmt]:
            keys = ", ".join(registry.RULE_KEYS[fmt])
            raise ValueError(f"{self.label}: category by {self.category.by!r}: a {fmt} trace has {keys}")
        self.offsets()
        return self

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path,) if isinstance(self.path, str) else self.path

    @property
    def label(self) -> str:
        """The file (or files) for messages."""
        return ", ".join(self.paths)

    @property
    def trace_format(self) -> Format:
        if self.format == "parquet":
            return "specdrill"
        if self.format is not None:
            return self.format
        detected = detected_format(self.paths, stamps(self.paths))
        if self.column is not None and detected != "specdrill":  # as before detection: a named column, a CSV's
            return "csv"
        return detected

    @property
    def has_lengths(self) -> bool:
        """Whether request i's lengths come from the trace (else the mix draws them, as for any shape)."""
        return registry.FORMATS[self.trace_format].has_lengths

    def offsets(self) -> np.ndarray:
        """The replayed send offsets, sorted (read-only; cached per file version)."""
        return self._replayed().offsets

    def phases(self) -> list[Phase]:
        return list(self._replayed().phases)

    @property
    def expected_requests(self) -> float:
        return float(len(self.offsets()))

    def recorded_lengths(self) -> tuple[int, int, float, float] | None:
        """(largest prompt, largest output, mean prompt, mean output) tokens the window replays, clipped as the
        requests are; None for a trace without lengths (the mix draws them)."""
        if not self.has_lengths:
            return None
        a = self._replayed().arrivals
        prompt_clip = self.max_prompt_tokens or a.max_prompt_tokens
        output_clip = self.max_output_tokens or a.max_output_tokens
        return (
            max(1, min(a.max_prompt_tokens, prompt_clip)), max(1, min(a.max_output_tokens, output_clip)),
            max(1.0, min(a.mean_prompt_tokens, prompt_clip)), max(1.0, min(a.mean_output_tokens, output_clip)),
        )  # fmt: skip

    def requests(self, indices: np.ndarray) -> ReplayedRequests:
        """What the trace records about requests `indices` of the replay: only those rows are read (a worker reads
        its share). Request i is the same whoever asks: it depends on the file, the window and the scaling."""
        if not self.has_lengths:
            raise ValueError(f"{self.label}: a {self.trace_format} trace records arrival times only, no lengths")
        replayed = self._replayed()
        indices = np.asarray(indices, dtype=np.int64)
        where = replayed.source[indices]
        fmt = self.trace_format
        arrivals = replayed.arrivals
        contents = registry.read_contents(self.paths, fmt, arrivals.files[where], arrivals.rows[where])
        failed = replayed.arrivals.failed[where]
        prompts = np.maximum(contents.prompt_tokens, 1)  # a recorded 0 still sends a one-token prompt
        outputs = np.maximum(contents.output_tokens, 1)
        if self.max_prompt_tokens is not None:
            prompts = np.minimum(prompts, self.max_prompt_tokens)
        if self.max_output_tokens is not None:
            outputs = np.minimum(outputs, self.max_output_tokens)
        categories: list[str | None]
        if isinstance(self.category, CategoryRule):
            categories = self.category.categories(contents.labels[self.category.by])
        else:
            categories = [self.category] * len(indices)
        categories = [self.failed_category if f else c for c, f in zip(categories, failed, strict=True)]
        blocks = None
        if contents.hash_ids is not None:
            blocks = [
                PrefixBlocks(tuple(int(h) for h in ids), self.block_tokens, int(copy))
                for ids, copy in zip(contents.hash_ids, replayed.copy[indices], strict=True)
            ]
        return ReplayedRequests(
            prompt_tokens=prompts, output_tokens=outputs, categories=categories, prefixes=blocks, expect_error=failed
        )

    def _replayed(self) -> Replayed:
        return read_window(
            self.paths, self.trace_format, self.column, self.arm, self.shape, self.start_s, self.duration_s,
            self.speed, self.rate_scale, self.target_rate, self.seed, self.failed == "expect_error", self.bin_s,
            stamps(self.paths),
        )  # fmt: skip


Shape = Annotated[
    Quiet | Ramp | Sustained | Step | CrossAndRecover | Day | Concurrency | Replay, Field(discriminator="kind")
]
