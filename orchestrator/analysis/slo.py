"""Service-level objectives for goodput: deadlines per request, optionally per workload category."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SloDeadlines(BaseModel):
    """A deadline left as None does not apply."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ttft_s: float | None = Field(default=2.0, gt=0)
    tpot_s: float | None = Field(default=0.05, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)


class Slos(SloDeadlines):
    """Deadlines for every request, replaced as a whole for the categories named in per_category."""

    per_category: dict[str, SloDeadlines] = Field(default_factory=dict)

    def for_category(self, category: str | None) -> SloDeadlines:
        return self.per_category.get(category, self) if category is not None else self
