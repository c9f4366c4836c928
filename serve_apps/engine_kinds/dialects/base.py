"""What a server says about its speculation, in one declaration: a `Dialect`.

A dialect is data, not code, so every layer can follow it without importing a server's names: the load worker
(loadshapes, which imports no serve_apps) gets `request` copied into its plan (loadshapes.spec_fields), the
endpoint scraper (orchestrator/execute/endpoint_scrape.py) reads `metrics_path` with the names below, and the
analysis (orchestrator/analysis/verify/endpoint.py) reconciles the trace with the counters in `reconciles` and says
per check what the telemetry cannot prove (`steps`, `gauge_note`). A server's names live only in its dialect's
module under serve_apps/engine_kinds/dialects/ (tests/serve_apps/engine_kinds/test_metric_names.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# The trace columns a server's per-request answer can fill (loadshapes/trace.py): the per-step lists, or totals
# where a server reports no steps. A total a dialect fills wins over the one summed from lists.
SpecColumn = Literal[
    "per_step_drafted", "per_step_accepted", "mean_acceptance_length", "spec_steps", "drafted_tokens",
    "accepted_tokens",
]  # fmt: skip
# The counters an endpoint sample keeps (orchestrator/rundir/endpoint_samples.py), whatever a server calls them.
CounterKey = Literal["num_drafts", "draft_tokens", "accepted_tokens", "generation_tokens"]
COUNTER_KEYS: tuple[CounterKey, ...] = ("num_drafts", "draft_tokens", "accepted_tokens", "generation_tokens")
# The trace columns a counter can be reconciled with (summed over a unit's rows).
TraceTotal = Literal["spec_steps", "drafted_tokens", "accepted_tokens", "output_tokens"]


@dataclass(frozen=True)
class RequestFormat:
    """How to ask a server for its per-request speculation figures, and where they are in its stream."""

    body: Mapping[str, object] = field(default_factory=dict)  # added to every request's JSON body
    headers: Mapping[str, str] = field(default_factory=dict)  # added to every request's headers
    # trace column -> dotted path of the value in a streamed chunk's JSON ("a.b.c": chunk["a"]["b"]["c"])
    fields: Mapping[SpecColumn, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Dialect:
    """A server's speculation telemetry. Prometheus names match by suffix (Ray Serve LLM prefixes vLLM's:
    ray_vllm:...) and sum over label sets (a data-parallel server labels each engine)."""

    name: str
    request: RequestFormat
    running: str  # gauge: requests in the running batch
    waiting: str  # gauge: requests waiting
    counters: Mapping[CounterKey, str]  # what the server counts, by the sample's key
    speculation: str  # the fragment every speculation metric's name holds (the warm-up's record of them)
    metrics_path: str = "/metrics"  # where its Prometheus text is
    draft_length: str | None = None  # gauge of the draft length in force, where the server exports one
    # (trace total, counter) pairs that must be equal over every unit
    reconciles: tuple[tuple[TraceTotal, CounterKey], ...] = ()
    # What the executed-k checks can stand on: "per_step" (the server lists each step's drafts per request) or
    # "none" (no per-step draft length at all: every step check is not verifiable, for the reason `steps_note`).
    steps: Literal["per_step", "none"] = "per_step"
    steps_note: str = ""
    # What the draft-length gauge's samples can and cannot show (said with the samples it took).
    gauge_note: str = ""


def field_keys(request: RequestFormat) -> tuple[str, ...]:
    """The top-level JSON keys holding the dialect's per-request fields."""
    return tuple(sorted({path.split(".", 1)[0] for path in request.fields.values()}))
