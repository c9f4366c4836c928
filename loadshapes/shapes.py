"""Load shapes: the arrival RATE over time (open loop), as named phases the report can find again.

A shape is data (pydantic) that expands into phases, each a linear rate segment `rate_start -> rate_end` over
`duration` seconds. Arrival times come from `arrivals(shape, ...)` (arrivals.py), computed ahead of the run.
`concurrency` is the one closed-loop shape (N users, each sending when its previous request ends) and says so.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


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


Shape = Annotated[Quiet | Ramp | Sustained | Step | CrossAndRecover | Day | Concurrency, Field(discriminator="kind")]
