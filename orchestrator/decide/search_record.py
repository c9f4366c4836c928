"""search.json: the file `specdrill search` writes beside its run directory's units, and `specdrill report` reads
to show the search path."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.decide.search import Outcome, SearchConfig, SearchPoint, Step

SEARCH_FILE = "search.json"
Mode = Literal["virtual", "real"]


class StepRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: Step
    shape: str  # the unit's shape in the run's campaign
    point: SearchPoint  # the rate's point after this unit (pooled with the rate's earlier units)
    # Why this unit does not count (its engine lagged: the host's latencies); its point is then what the unit
    # alone measured, and the rate's pooled point is unchanged.
    discarded: str | None = None


class SearchRecord(BaseModel):
    """What the search did, step by step, and what it found."""

    model_config = ConfigDict(extra="forbid")
    arm: str
    against: str
    mode: Mode
    config: SearchConfig
    steps: list[StepRecord]
    points: list[SearchPoint]
    outcome: Outcome | None
    requests: int
    lines: list[str]
