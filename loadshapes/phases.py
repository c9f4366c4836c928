"""A phase of a load shape: one named, linear segment of the arrival rate."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Phase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    duration: float = Field(gt=0)
    rate_start: float = Field(ge=0)
    rate_end: float = Field(ge=0)

    @property
    def expected_requests(self) -> float:
        return 0.5 * (self.rate_start + self.rate_end) * self.duration
