"""What counts as good: the deadlines a request must meet to count toward goodput, for every request and per
workload category. The campaign's `slo:` key is SloConfig; the report's analysis (orchestrator/analysis/opmap/slo.py,
the same rule in SQL), the load worker's live counter and the simulator's sweeps all judge a request by
`Deadlines.met`.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class Deadlines(BaseModel):
    """A request is good (counts toward goodput) when it meets every deadline that is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ttft_s: float | None = Field(default=None, gt=0, description="replaces `slo.ttft_s` for this category")
    tpot_s: float | None = Field(default=None, gt=0, description="replaces `slo.tpot_s` for this category")
    e2e_s: float | None = Field(default=None, gt=0, description="replaces `slo.e2e_s` for this category")

    def met(self, *, ok: bool, ttft_s: float | None, tpot_s: float | None, e2e_s: float | None) -> bool:
        """Completed and within every deadline that is set. A missing TTFT or end-to-end time misses a deadline
        that is set; a one-token answer (no per-token latency) cannot miss the per-token one."""
        return (
            ok
            and (self.ttft_s is None or _within(ttft_s, self.ttft_s))
            and (self.e2e_s is None or _within(e2e_s, self.e2e_s))
            and (self.tpot_s is None or tpot_s is None or not tpot_s > self.tpot_s)
        )


def _within(value: float | None, limit: float) -> bool:
    return value is not None and not math.isnan(value) and value <= limit


class SloConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ttft_s: float | None = Field(default=2.0, gt=0, description="time to first token, from the scheduled time")
    tpot_s: float | None = Field(default=0.05, gt=0, description="time per output token after the first")
    e2e_s: float | None = Field(default=None, gt=0, description="end to end, from the scheduled time")
    per_category: dict[str, Deadlines] = Field(default_factory=dict)  # overrides, deadline by deadline

    def for_category(self, category: str | None) -> Deadlines:
        """The deadlines of a category: the campaign's, with the ones its per_category entry sets replaced."""
        base = Deadlines(ttft_s=self.ttft_s, tpot_s=self.tpot_s, e2e_s=self.e2e_s)
        override = self.per_category.get(category) if category is not None else None
        if override is None:
            return base
        return base.model_copy(update={k: v for k, v in override.model_dump().items() if v is not None})

    def met(
        self, category: str | None, *, ok: bool, ttft_s: float | None, tpot_s: float | None, e2e_s: float | None
    ) -> bool:
        return self.for_category(category).met(ok=ok, ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=e2e_s)
