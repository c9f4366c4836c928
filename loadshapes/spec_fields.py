"""What a server says about speculation in each response, and how to ask for it: a plan's copy of its engine
kind's dialect (serve_apps/engine_kinds/dialects/), as data. The load worker follows it without knowing any
server: it adds `body` to each request and `headers` to its head, and reads each trace column from the dotted
path `fields` gives, in whichever streamed chunk holds it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The trace columns a response can fill (loadshapes/trace.py); the dialects name the same (SpecColumn there).
SpecColumn = Literal[
    "per_step_drafted", "per_step_accepted", "mean_acceptance_length", "spec_steps", "drafted_tokens",
    "accepted_tokens",
]  # fmt: skip
LIST_COLUMNS: tuple[SpecColumn, ...] = (
    "per_step_drafted",
    "per_step_accepted",
    "mean_acceptance_length",
)  # telemetry_columns' own
TOTAL_COLUMNS: tuple[SpecColumn, ...] = (
    "spec_steps",
    "drafted_tokens",
    "accepted_tokens",
)  # else summed from the per-step lists


class SpeculationFields(BaseModel):
    """Empty: the server is asked nothing and nothing is read (a plan without a dialect)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    body: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    fields: dict[SpecColumn, str] = Field(default_factory=dict)

    def top_keys(self) -> tuple[bytes, ...]:
        """The quoted top-level keys of the fields' paths, as a raw chunk holds them (`b'"metrics"'`)."""
        return tuple(sorted({f'"{path.split(".", 1)[0]}"'.encode() for path in self.fields.values()}))


def extract(payload: dict[str, Any], fields: dict[SpecColumn, str]) -> dict[SpecColumn, Any]:
    """The fields' values present in one chunk (a null on the way, or a missing key, gives nothing)."""
    found: dict[SpecColumn, Any] = {}
    for column, path in fields.items():
        value: Any = payload
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
            if value is None:
                break
        if value is not None:
            found[column] = value
    return found
