"""The traces are the evidence; unit markers, the manifest's unit entries and summary.json are caches of it.

A marker is checked against its unit's trace files when a run is read: the rows it counts must be the rows the
files' footers hold, and where it recorded them (TraceStamp: size and rows per file, taken when the unit was
recorded) the unit's files must be exactly those. A marker that disagrees is refused in one line naming it
(nothing rebuilds a marker: it also holds what only the run saw, the load workers' summaries). A file the
marker did not record is another writer's, or a leftover: the report would count its rows too.

summary.json is sealed when the report writes it: a digest of its own content and of the traces' stamps. A
summary whose seal does not match (edited by hand, an older specdrill's, or written for other trace files) is
not used: the commands that read it rebuild it from the traces, and say so in one line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from loadshapes.badfile import BadFileError, parquet_metadata
from orchestrator.rundir.layout import RunStore, TraceStamp, UnitResult

EVIDENCE = "evidence"  # summary.json's key for its seal


def check_unit_evidence(
    store: RunStore, result: UnitResult, recorded: dict[str, Any] | None
) -> dict[str, TraceStamp]:
    """The marker agrees with its unit's trace files, timeline and manifest entry, or one line naming it. Returns
    the unit's trace files as checked (size and rows by name): the seal's digest is taken from them."""
    unit, marker = result.unit, store.path(store.unit_marker(result.unit))
    redo = "the marker or the traces changed after the unit ran; delete the marker and resume the run to redo it"
    files = store.unit_trace_files(unit)
    if result.trace_stamps is not None:
        for name in sorted(files.keys() - result.trace_stamps.keys()):
            raise BadFileError(f"{store.trace_directory(unit)}/{name}", f"a trace file of unit {unit.key} that its "
                               f"marker {marker} did not record (another writer's?): the report would count its "
                               f"rows; remove it, or the unit's marker to redo the unit")  # fmt: skip
        for name, stamp in sorted(result.trace_stamps.items()):
            now = files.get(name)
            if now is None:
                raise BadFileError(f"{store.trace_directory(unit)}/{name}", f"missing (a trace file of unit "
                                   f"{unit.key}; {marker} counts {stamp.rows} rows in it)")  # fmt: skip
            if now != stamp:
                raise BadFileError(f"{store.trace_directory(unit)}/{name}", f"{now.bytes} bytes, {now.rows} rows; "
                                   f"{marker} recorded {stamp.bytes} bytes, {stamp.rows} rows: {redo}")  # fmt: skip
    held = sum(f.rows for f in files.values())
    if held != result.rows:
        raise BadFileError(marker, f"counts {result.rows} rows, unit {unit.key}'s {len(files)} trace files hold "
                                   f"{held}: {redo}")  # fmt: skip
    if result.timeline_steps:
        steps = parquet_metadata(store.fs, store.timeline_file(unit), "a step timeline").num_rows
        if steps != result.timeline_steps:
            raise BadFileError(marker, f"counts {result.timeline_steps} engine steps, unit {unit.key}'s step "
                                       f"timeline holds {steps}: {redo}")  # fmt: skip
    if recorded is not None and recorded.get("rows") != result.rows:
        raise BadFileError(marker, f"counts {result.rows} rows, the run's manifest.json records "
                                   f"{recorded.get('rows')} for unit {unit.key}: {redo}")  # fmt: skip
    return files


def traces_digest(trace_files: Mapping[str, Mapping[str, TraceStamp]]) -> str:
    """A digest of units' trace files (unit key -> name -> size and rows), as check_unit_evidence read them."""
    data = {key: {name: [s.bytes, s.rows] for name, s in files.items()} for key, files in trace_files.items()}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _content_digest(data: dict[str, Any], traces: str) -> str:
    content = {k: v for k, v in data.items() if k != EVIDENCE}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{traces}\n{canonical}".encode()).hexdigest()


def seal(data: dict[str, Any], traces: str) -> dict[str, Any]:
    """summary.json's content with its seal: the traces' digest and a digest of the content and the traces."""
    return {**data, EVIDENCE: {"traces": traces, "seal": _content_digest(data, traces)}}


def seal_problem(data: Any, traces: str) -> str | None:
    """Why the summary is not the traces' (None where its seal holds): no seal, other trace files, edited."""
    if not isinstance(data, dict) or not isinstance(data.get(EVIDENCE), dict):
        return "it has no seal (written by an older specdrill, or by hand)"
    evidence = data[EVIDENCE]
    if evidence.get("traces") != traces:
        return "it was written for other trace files"
    if evidence.get("seal") != _content_digest(data, traces):
        return "its content was changed after the report wrote it"
    return None
