"""The run directory every runner writes and the report reads (local path or pyarrow filesystem URI): a unit and
its result, the store's files (manifest, one marker per complete unit, traces, engine step timelines) and the
checks of a unit's files. The manifest's contents are orchestrator/rundir/manifest.py's, the timeline and merged
trace files orchestrator/rundir/unit_files.py's.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import quote

from pyarrow.fs import FileSelector, FileType
from pydantic import BaseModel, ConfigDict, ValidationError

from loadshapes.badfile import (
    BadFileError,
    make_directory,
    parquet_metadata,
    require_directory,
    require_file,
    write_failed,
)
from loadshapes.trace import FILE_SCHEMA, PART_FILE, filesystem, writer_id
from orchestrator.rundir.endpoint_samples import ROOT as ENDPOINT_METRICS
from orchestrator.rundir.worker_summary import WorkerSummary
from serve_apps.config_io import first_error

MANIFEST = "manifest.json"


class Unit(BaseModel):
    model_config = ConfigDict(frozen=True)
    arm: str
    shape: str
    repeat: int

    @property
    def key(self) -> str:
        return f"{self.arm}/{self.shape}/r{self.repeat}"

    @property
    def part_prefix(self) -> str:
        return PART_FILE + writer_id(self.arm, self.shape, self.repeat)


class TraceStamp(BaseModel):
    """A trace file as its unit's marker saw it: what `report` checks the file against (rundir/evidence.py)."""

    model_config = ConfigDict(frozen=True)
    bytes: int
    rows: int


class UnitResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    unit: Unit
    start_ns: int
    end_ns: int
    duration_s: float
    scheduled: int
    rows: int
    saturated: bool
    lateness_p99_s: float
    workers: list[WorkerSummary]
    timeline_steps: int
    incomplete: bool = False  # a load worker was lost: rows < scheduled, the gap is `missing`
    missing: int = 0
    tpot_p50_s: float | None = None  # of the unit's ok requests with a TPOT; None when it has none
    # Engine lag (the simulated engine in real time: how late a step's tokens went out after the model's step
    # end, wall seconds, over every engine of the unit); None where no engine reports it (vLLM, virtual time).
    engine_lag_p50_s: float | None = None
    engine_lag_p99_s: float | None = None
    engine_lag_max_s: float | None = None
    engine_lag_share: float | None = None  # summed lag / summed model step time: how much slower the engine ran
    engine_lag_bound: float | None = None  # the share it was held to (load.engine_lag_bound)
    engine_lagged: bool = False  # share above the bound: the unit's latencies are the host's, not the model's
    # The unit's rows in one file: its workers' part files (their `files`) merged when the unit completed; None
    # where they stay as written (a single file already, as in virtual time).
    trace_file: str | None = None
    # Every trace file of the unit (its writer prefix) by name when the unit was recorded: size and rows. None in
    # markers written before specdrill recorded them (their rows are still checked against the files' footers).
    trace_stamps: dict[str, TraceStamp] | None = None

    @property
    def statuses(self) -> dict[str, int]:
        """Rows by status (ok, error, timeout, cancelled), summed over the workers."""
        total: dict[str, int] = {}
        for summary in self.workers:
            for status, n in summary.statuses.items():
                total[status] = total.get(status, 0) + n
        return total


class RunStore:
    """The run directory (local path or pyarrow filesystem URI): manifest, unit markers, traces, timelines."""

    def __init__(self, root: str, *, create: bool = True) -> None:
        """`create`: a runner's output, made where missing; else a run directory a command reads, which must exist."""
        self.root = root.rstrip("/") or "/"
        self.fs, self.base = filesystem(self.root)
        if create:
            make_directory(self.fs, self.base, "run directory")
        else:
            require_directory(self.fs, self.base, "a run directory")

    @classmethod
    def existing(cls, root: str) -> RunStore | None:
        """The run directory if it exists, without creating it (a campaign refused at start leaves nothing)."""
        fs, base = filesystem(root.rstrip("/"))
        return cls(root) if fs.get_file_info(base).type != FileType.NotFound else None

    @property
    def traces(self) -> str:
        return f"{self.root}/traces"

    @property
    def timelines(self) -> str:
        return f"{self.root}/timelines"

    def path(self, relative: str) -> str:
        return f"{self.base}/{relative}"

    def exists(self, relative: str) -> bool:
        return bool(self.fs.get_file_info(self.path(relative)).type != FileType.NotFound)

    def read_json(self, relative: str, what: str = "a JSON file") -> Any:
        """The JSON file, or one line naming it: missing, a directory, truncated or not JSON (`what` it is)."""
        path = self.path(relative)
        require_file(self.fs, path, what)
        with self.fs.open_input_stream(path) as stream:
            raw = stream.read()
        try:
            return json.loads(raw.decode())
        except UnicodeDecodeError:
            raise BadFileError(path, f"not UTF-8 text, expected JSON ({what})") from None
        except json.JSONDecodeError as exc:
            where = "empty" if not raw.strip() else f"{exc.msg} (line {exc.lineno}, column {exc.colno})"
            raise BadFileError(path, f"not valid JSON ({what}): {where}") from None

    def write_json(self, relative: str, data: Any) -> None:
        self.write_text(relative, json.dumps(data, indent=2, sort_keys=True, default=str))

    def write_text(self, relative: str, text: str) -> None:
        """Atomically (a temporary name, then a rename): a reader never sees half a file, and a write that fails
        leaves the previous one, or one line naming the file that could not be written."""
        path = self.path(relative)
        directory = path.rsplit("/", 1)[0]
        make_directory(self.fs, directory, "directory")
        if self.fs.get_file_info(path).type == FileType.Directory:
            raise BadFileError(path, "is a directory, expected a file (cannot write it)")
        temporary = f"{directory}/.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with self.fs.open_output_stream(temporary) as sink:
                sink.write(text.encode())
            self.fs.move(temporary, path)
        except OSError as exc:
            if self.fs.get_file_info(temporary).type == FileType.File:
                self.fs.delete_file(temporary)
            raise write_failed(path, exc) from None
        except BaseException:  # Ctrl-C or SIGTERM between the write and the rename: no temporary left behind
            if self.fs.get_file_info(temporary).type == FileType.File:
                self.fs.delete_file(temporary)
            raise

    def remove(self, relative: str) -> None:
        path = self.path(relative)
        if self.fs.get_file_info(path).type == FileType.File:
            try:
                self.fs.delete_file(path)
            except OSError as exc:
                raise BadFileError(path, f"cannot remove it: {exc.strerror or exc}") from None

    def trace_directory(self, unit: Unit) -> str:
        """The unit's trace partition, where its part files lie beside the other repeats' (Hive: arm=/shape=)."""
        return f"{self.base}/traces/arm={quote(unit.arm, safe='')}/shape={quote(unit.shape, safe='')}"

    def timeline_file(self, unit: Unit) -> str:
        directory = f"{self.base}/timelines/arm={quote(unit.arm, safe='')}/shape={quote(unit.shape, safe='')}"
        return f"{directory}/r{unit.repeat}.parquet"

    def check_unit_files(self, result: UnitResult) -> None:
        """The files a complete unit's marker vouches for are there: its trace files (by name, so a run directory
        moved elsewhere still checks) and, where it recorded steps, its step timeline. A deleted file would
        otherwise make the report quietly count fewer rows or verify nothing."""
        unit, marker = result.unit, self.path(self.unit_marker(result.unit))
        if result.timeline_steps:
            timeline = self.timeline_file(unit)
            require_file(self.fs, timeline, f"unit {unit.key}'s step timeline; {marker} counts "
                                            f"{result.timeline_steps} steps")  # fmt: skip
            self._check_columns(timeline, TIMELINE_COLUMNS, "a step timeline")
        listed = [result.trace_file] if result.trace_file else [f for w in result.workers for f in w.files]
        if not result.rows or not listed:
            return
        directory = self.trace_directory(unit)
        present = {i.base_name for i in self.fs.get_file_info(FileSelector(directory, allow_not_found=True))}
        for name in (f.rsplit("/", 1)[-1] for f in listed):
            if name not in present:
                raise BadFileError(f"{directory}/{name}", f"missing (a trace file of unit {unit.key}; {marker} counts "
                                                          f"{result.rows} rows)")  # fmt: skip
            self._check_columns(f"{directory}/{name}", frozenset(FILE_SCHEMA.names), "a trace part file")

    def _check_columns(self, path: str, known: frozenset[str], what: str) -> None:
        """Every column of the file's footer is one specdrill writes: a name it does not know is a damaged footer
        (a flipped bit in a column name), which the readers would otherwise take for a column they lack (DuckDB's
        union_by_name: nulls, or a binder error with no file named). Footer only, no row read."""
        schema = parquet_metadata(self.fs, path, what).schema
        names = {schema.column(i).path.split(".", 1)[0] for i in range(len(schema))}
        unknown = sorted(names - known)
        if unknown:
            raise BadFileError(path, f"not a readable Parquet file ({what}): unknown column {unknown[0]!r}")

    def unit_trace_files(self, unit: Unit) -> dict[str, TraceStamp]:
        """The unit's trace files now (its writer prefix in its partition), by name: size and rows (footer)."""
        directory = self.trace_directory(unit)
        return {
            info.base_name: TraceStamp(
                bytes=info.size or 0, rows=parquet_metadata(self.fs, info.path, "a trace part file").num_rows
            )
            for info in self.fs.get_file_info(FileSelector(directory, allow_not_found=True))
            if info.base_name.startswith(unit.part_prefix) and info.base_name.endswith(".parquet")
        }

    def unit_marker(self, unit: Unit) -> str:
        return f"units/{unit.arm}/{unit.shape}/r{unit.repeat}.json"

    def is_complete(self, unit: Unit) -> bool:
        return self.exists(self.unit_marker(unit))

    def read_marker(self, unit: Unit) -> UnitResult:
        """The unit's marker (the proof it completed), or one line naming the file: not JSON, not a marker, or
        another unit's."""
        relative = self.unit_marker(unit)
        data = self.read_json(relative, f"the marker of unit {unit.key}")
        try:
            result = UnitResult.model_validate(data)
        except ValidationError as exc:
            raise BadFileError(self.path(relative), f"not a unit marker: {first_error(exc)}") from None
        if result.unit != unit:
            raise BadFileError(self.path(relative), f"holds unit {result.unit.key}, expected {unit.key}")
        return result

    def remove_partial(self, unit: Unit) -> int:
        """Delete part files a previous, interrupted attempt at this unit left behind."""
        removed = 0
        for root in (f"{self.base}/traces", f"{self.base}/timelines", f"{self.base}/{ENDPOINT_METRICS}"):
            directory = f"{root}/arm={quote(unit.arm, safe='')}/shape={quote(unit.shape, safe='')}"
            if self.fs.get_file_info(directory).type == FileType.NotFound:
                continue
            for info in self.fs.get_file_info(FileSelector(directory)):
                name = info.base_name
                if (
                    name.startswith(unit.part_prefix)
                    or name.startswith(f".tmp-{unit.part_prefix}")
                    or (name == f"r{unit.repeat}.parquet")
                ):
                    self.fs.delete_file(info.path)
                    removed += 1
        return removed


# The step timeline file (timelines/arm=/shape=/r<repeat>.parquet): one row per engine step, every engine of the
# arm (each DP rank its own engine_id). k is null where the engine could not observe it (vLLM: a step whose
# drafts no request verified); k_scheduled and num_drafts are null for the simulated engine, which reports
# neither (its k is the schedule's by construction). batched_tokens (tokens computed in the step: prefill chunks,
# 1 + drafts per decoding request) and kv_tokens (KV tokens the step read) are what `specdrill calibrate` fits step
# times to; null in timelines written before they existed, and kv_tokens of vLLM is its block usage x block size.
TIMELINE_INT_COLUMNS = (
    "dp_rank", "batch_size", "num_prefill", "k", "k_scheduled", "drafted", "accepted", "num_drafts", "waiting",
    "batched_tokens", "kv_tokens",
)  # fmt: skip


# lag_s (float64, wall seconds): how late the simulated engine in real time handed a step's tokens out after the
# model's step end. Only that engine knows it: the column is written when some engine reported it (null for
# the others), and absent otherwise (vLLM, virtual time), so files without it stay what they were.
TIMELINE_FLOAT_COLUMNS = ("lag_s",)

# drafts_skipped (bool): vLLM 0.33+ on model runner V2 proposed no drafts in the step (skip_drafts). Written when
# some engine reported it, absent otherwise (vLLM 0.32, V1, n-gram methods, the simulated engine): absent reads
# as no skipped step.
TIMELINE_BOOL_COLUMNS = ("drafts_skipped",)


TIMELINE_COLUMNS = frozenset(
    {"engine_id", "start_ns", "end_ns", *TIMELINE_INT_COLUMNS, *TIMELINE_FLOAT_COLUMNS, *TIMELINE_BOOL_COLUMNS}
)
