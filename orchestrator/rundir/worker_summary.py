"""What a load worker reports of its unit (the summary file it writes, kept in the unit's result in the manifest):
written by the executors (orchestrator/execute/load_workers.py, orchestrator/virtual/executor.py), read with the
run directory, so it lives below both."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WorkerSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    worker: int
    arm: str
    shape: str
    repeat: int
    scheduled: int
    sent: int
    rows_written: int
    files: list[str]
    start_ns: int | None
    lateness_p50_s: float
    lateness_p99_s: float
    lateness_max_s: float
    saturated: bool
    max_in_flight: int
    connections_opened: int = 0  # keep-alive connections the worker opened to the target
    cpu_s: float = 0.0  # the worker process's CPU time
    cpu_share: float | None = None  # of one core, over the unit: near 1, the worker was CPU-bound
    niceness: int | None = None  # the priority it ran at (it raises itself to 0 where it may)
    niceness_at_start: int | None = None
    connection_wait_p99_s: float = 0.0  # actual send minus dispatch: waits for a free or new connection
    waited_at_connection_cap: int = 0  # requests that found all max_in_flight connections busy (saturated)
    statuses: dict[str, int]  # rows by status, as the worker counted them
    node_id: str | None = None
    exit_code: int | None = None
    lost: bool = False  # the worker died mid-run: its flushed rows are in the trace, the rest is missing
    lost_reason: str | None = None
    # Multi-turn sessions: later turns sent (a row each, in `scheduled`), and those not sent by why (after_end: due
    # after the shape's end; after_failure: the previous turn failed; at_stop: the worker stopped first).
    session_turns_sent: int = 0
    session_turns_not_sent: dict[str, int] = Field(default_factory=dict)
