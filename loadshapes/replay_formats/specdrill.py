"""specdrill: a specdrill trace (a part file or a trace directory), its `scheduled_ns`; `arm` and `shape` pick the
partition."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from loadshapes import limits
from loadshapes.replay_formats.base import OneFileFormat, Probe, TraceError
from loadshapes.trace import PARTITION_COLUMNS, read_traces


class Specdrill(OneFileFormat):
    name = "specdrill"

    def detects(self, probe: Probe) -> bool:
        return probe.directory or probe.suffix == ".parquet" or probe.head.startswith(b"PAR1")

    def arrival_ns(self, path: str, column: str | None, arm: str | None, shape: str | None) -> np.ndarray:
        if column is not None:
            raise TraceError(f"{path}: column names a CSV column; a trace replays scheduled_ns")
        return _trace_ns(path, arm, shape)


FORMAT = Specdrill()


def _trace_ns(path: str, arm: str | None, shape: str | None) -> np.ndarray:
    where = None
    for name, wanted in (("arm", arm), ("shape", shape)):
        if wanted is not None:  # read only the partition asked for
            match = ds.field(name) == wanted
            where = match if where is None else where & match
    try:
        table = read_traces(path, columns=["scheduled_ns", *PARTITION_COLUMNS], where=where)
    except (pa.ArrowException, OSError) as e:
        raise TraceError(f"{path}: not a readable trace: {e}") from None
    most = limits.current().replay_rows
    if table.num_rows > most:
        raise TraceError(
            f"{path}: {limits.figure(table.num_rows)} trace rows, more than {limits.figure(most)} "
            f"(limit replay_rows; raise it with {limits.raise_hint('replay_rows', table.num_rows)})"
        )
    groups = table.group_by(list(PARTITION_COLUMNS)).aggregate([]).to_pylist()
    pairs = sorted(f"{g['arm']}/{g['shape']}" for g in groups)
    if not pairs:
        raise TraceError(f"{path}: no trace rows for arm={arm!r} shape={shape!r}")
    if len(pairs) > 1:
        raise TraceError(f"{path}: {len(pairs)} arm/shape pairs ({', '.join(pairs)}): pick one with arm and shape")
    scheduled = table["scheduled_ns"]
    if scheduled.null_count:
        raise TraceError(f"{path}: {scheduled.null_count} rows without scheduled_ns")
    return np.asarray(scheduled.to_numpy()).astype(np.int64)
