"""Service-level objectives for goodput: deadlines per request, optionally per workload category."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
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


def met_slo(
    *,
    ok: np.ndarray,
    ttft: np.ndarray,
    tpot: np.ndarray,
    e2e: np.ndarray,
    category: np.ndarray,
    categories: Sequence[str],
    slos: Slos,
) -> np.ndarray:
    """Completed and within every deadline that applies; `category` holds codes into `categories`, -1 for none."""
    deadlines = [slos.for_category(c) for c in categories] + [slos.for_category(None)]

    def limit(name: str) -> np.ndarray | float:
        values = np.array([getattr(d, name) or np.inf for d in deadlines], dtype=np.float64)
        if (values == values[0]).all():
            return float(values[0])  # one deadline for every category: no per-row copy of it
        picked: np.ndarray = values[np.where(category >= 0, category, len(categories))]
        return picked

    def within(values: np.ndarray, name: str) -> np.ndarray:
        bound = limit(name)
        inside: np.ndarray = np.isinf(bound) | (values <= bound)  # a missing value misses a deadline that is set
        return inside

    # A one-token answer has no per-token latency (NaN): that deadline cannot be missed.
    met: np.ndarray = ok & within(ttft, "ttft_s") & within(e2e, "e2e_s") & ~(tpot > limit("tpot_s"))
    return met
