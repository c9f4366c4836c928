"""search.json: the file `specdrill search` writes beside its run directory's units, and `specdrill report` reads
to show the search path."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.search.bracket import Outcome, SearchConfig, Step
from orchestrator.search.point import SearchPoint

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


class Executed(BaseModel):
    """What the searched arm's engines ran over every unit (orchestrator/search/executed.py): a dynamic arm on
    data-parallel engines runs static max k, and the search then measured that, not the schedule."""

    model_config = ConfigDict(extra="forbid")
    kind: str  # the arm's policy kind as configured: off, fixed, dynamic
    max_k: int  # fixed: k; dynamic: max k (vLLM's num_speculative_tokens)
    requests: int
    dropped: int  # requests whose engine reported schedule_dropped
    steps: int
    executed_k: dict[int, float]  # share of engine steps per executed k
    cause: str | None = None  # why vLLM dropped the schedule, where a drop was expected


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
    executed: Executed | None = None  # what the arm ran (None in a search.json before issue 40)
