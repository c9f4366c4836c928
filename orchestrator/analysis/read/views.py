"""The views over a run directory: its complete units' trace part files and engine step timelines, where they lie."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from urllib.parse import quote

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from loadshapes.badfile import parquet_metadata
from loadshapes.trace import ADDED_COLUMNS, PARTITION_COLUMNS, TRACE_SCHEMA, check_trace_version, filesystem
from orchestrator.analysis.read.db import EngineSettings, close, connect
from orchestrator.analysis.read.files import TIMELINE_FILE, TRACE_FILE, RunFiles
from orchestrator.analysis.read.footer import footer_table
from orchestrator.analysis.read.source import Requests, UnitKey, finish


def _part_files(fs: pafs.FileSystem, directory: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.endswith(".parquet") and not i.base_name.startswith(".")
    )


def _units_table(units: Sequence[UnitKey]) -> pa.Table:
    return pa.table(
        {
            "arm": pa.array([u[0] for u in units], pa.string()),
            "shape": pa.array([u[1] for u in units], pa.string()),
            "repeat": pa.array([u[2] for u in units], pa.int32()),
            "arm_path": pa.array([quote(u[0], safe="") for u in units], pa.string()),
            "shape_path": pa.array([quote(u[1], safe="") for u in units], pa.string()),
        }
    )


def _trace_view(
    con: duckdb.DuckDBPyConnection, root: str, units: Sequence[UnitKey], read: RunFiles
) -> list[tuple[str, str, str]]:
    """`trace`: the rows of the complete units only (a partial unit's rows are not evidence: the rerun redoes
    it), by partition (only their directories are listed) and by unit (a join on arm, shape, repeat). Returns
    the part files on a local disk (path, arm, shape), whose footers DuckDB can read."""
    fs, base = filesystem(root)
    con.register("complete_units", _units_table(units))
    pairs = sorted({(u[0], u[1]) for u in units})
    local = isinstance(fs, pafs.LocalFileSystem)
    located = [
        (f, arm, shape)
        for arm, shape in pairs
        for f in _part_files(fs, f"{base}/arm={quote(arm, safe='')}/shape={quote(shape, safe='')}")
    ]
    files = [f for f, _, _ in located]
    read.files += [(f, TRACE_FILE) for f in files]
    columns = ", ".join(f"t.{c}" for c in TRACE_SCHEMA.names if c not in (*PARTITION_COLUMNS, *ADDED_COLUMNS))
    if not files:
        empty = pa.Table.from_batches([], schema=TRACE_SCHEMA)
        con.register("trace_files", empty)
        source = "trace_files"
        arm_key, shape_key = "arm", "shape"
    elif local:
        listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
        source = (
            f"read_parquet([{listed}], hive_partitioning = true, "
            "hive_types = {'arm': VARCHAR, 'shape': VARCHAR}, union_by_name = true)"
        )
        arm_key, shape_key = "arm_path", "shape_path"  # the path segments, as the writer quoted them
    else:  # object stores: pyarrow's filesystems, streamed into DuckDB batch by batch
        dataset = ds.dataset(
            files,
            filesystem=fs,
            format="parquet",
            partitioning=ds.partitioning(pa.schema([(c, pa.string()) for c in PARTITION_COLUMNS]), flavor="hive"),
            partition_base_dir=base,
        )
        con.register("trace_files", dataset)
        source = "trace_files"
        arm_key, shape_key = "arm", "shape"
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW trace AS SELECT u.arm, u.shape, {columns} FROM {source} t "
        f"JOIN complete_units u ON t.arm = u.{arm_key} AND t.shape = u.{shape_key} AND t.repeat = u.repeat"
    )
    return located if local else []


# What the replay of a stateful rule (SGLang's adaptive steps, TensorRT-LLM's gate) reads of each step besides its
# batch size and k (orchestrator/analysis/verify/replayed.py); null where a timeline lacks them.
RULE_COLUMNS = ("num_prefill", "drafted", "accepted")


def steps_view(
    con: duckdb.DuckDBPyConnection, run_dir: str, units: Sequence[UnitKey], read: RunFiles | None = None
) -> frozenset[str]:
    """`steps`: every engine step of the complete units' timelines (arm, shape, repeat, engine_id, start_ns,
    end_ns, batch_size, k, drafts_skipped); the arms that have one. drafts_skipped is false where a file lacks it
    (every engine but vLLM 0.33+ on model runner V2, and timelines written before it existed)."""
    fs, base = filesystem(run_dir)
    found = []
    with_skip: set[str] = set()  # the files whose footer has the column
    with_rule: set[str] = set()  # the files with what a stateful rule's replay reads (num_prefill, drafted, accepted)
    for arm, shape, repeat in units:
        path = f"{base}/timelines/arm={quote(arm, safe='')}/shape={quote(shape, safe='')}/r{repeat}.parquet"
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            continue
        # empty: no steps (or an endpoint unit of an older specdrill)
        footer = parquet_metadata(fs, path, TIMELINE_FILE)
        if footer.num_rows:
            if "drafts_skipped" in footer.schema.names:
                with_skip.add(path)
            if set(RULE_COLUMNS) <= set(footer.schema.names):
                with_rule.add(path)
            found.append((path, arm, shape, repeat))
            if read is not None:
                read.files.append((path, TIMELINE_FILE))
    if not found:
        return frozenset()
    con.register(
        "timeline_files",
        pa.table(
            {
                "filename": pa.array([f[0] for f in found], pa.string()),
                "arm": pa.array([f[1] for f in found], pa.string()),
                "shape": pa.array([f[2] for f in found], pa.string()),
                "repeat": pa.array([f[3] for f in found], pa.int32()),
            }
        ),
    )
    if isinstance(fs, pafs.LocalFileSystem):
        listed = ", ".join("'" + f[0].replace("'", "''") + "'" for f in found)
        source = f"read_parquet([{listed}], filename = true, union_by_name = true)"
    else:
        tables = []
        columns = ["engine_id", "start_ns", "end_ns", "batch_size", "k"]
        for path, *_ in found:
            with fs.open_input_file(path) as handle:
                wanted = [
                    *columns,
                    *(RULE_COLUMNS if path in with_rule else ()),
                    *(("drafts_skipped",) * (path in with_skip)),
                ]
                part = pq.read_table(handle, columns=wanted)
            if path not in with_skip:
                part = part.append_column("drafts_skipped", pa.nulls(part.num_rows, pa.bool_()))
            for name in RULE_COLUMNS if path not in with_rule else ():
                part = part.append_column(name, pa.nulls(part.num_rows, pa.int64()))
            tables.append(part.append_column("filename", pa.array([path] * part.num_rows, pa.string())))
        con.register("timeline_rows", pa.concat_tables(tables))
        source = "timeline_rows"
    has_column = bool(with_skip) or source == "timeline_rows"
    skipped_sql = "coalesce(s.drafts_skipped, false)" if has_column else "false"
    rule_sql = ", ".join(
        f"s.{c}" if with_rule or source == "timeline_rows" else f"NULL::BIGINT AS {c}" for c in RULE_COLUMNS
    )
    con.execute(
        "CREATE OR REPLACE TEMP VIEW steps AS SELECT f.arm, f.shape, f.repeat, s.engine_id, s.start_ns, s.end_ns, "
        f"s.batch_size, s.k, {rule_sql}, {skipped_sql} AS drafts_skipped "
        f"FROM {source} s JOIN timeline_files f "
        "ON s.filename = f.filename"
    )
    return frozenset(f[1] for f in found)


def run_requests(
    run_dir: str,
    units: Sequence[UnitKey],
    *,
    settings: EngineSettings | None = None,
    step_lists_only: frozenset[str] = frozenset(),
) -> Requests:
    """The views over a run directory's traces and timelines, complete units only. `step_lists_only`: arms whose
    steps come from the rows' per-step lists even where a timeline exists."""
    traces = f"{run_dir.rstrip('/')}/traces"
    check_trace_version(traces)
    read = RunFiles(filesystem(traces)[0])
    con = connect(settings or EngineSettings.from_env())
    try:
        try:
            local_files = _trace_view(con, traces, units, read)
            footers = footer_table(con, local_files)
            step_arms = steps_view(con, run_dir.rstrip("/"), units, read) - step_lists_only
            requests = finish(con, None, step_arms, has_steps=bool(step_arms), footers=footers)
        except duckdb.Error as exc:
            raise read.blame(exc) from None
    except BaseException:
        close(con)
        raise
    return dataclasses.replace(requests, files=read)
