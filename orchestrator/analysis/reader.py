"""Reading a trace for analysis: only the columns asked for, with low-cardinality strings kept as dictionaries.

The same rows as loadshapes.trace.read_traces, but arm, shape, run, category and status arrive as integer codes
instead of ten million materialised strings, which the analysis would only hash back into codes.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.dataset as ds

from loadshapes.trace import PARTITION_COLUMNS, TRACE_SCHEMA, _filesystem

DICTIONARY_COLUMNS = frozenset(
    {
        "run",
        "policy",
        "topology",
        "phase",
        "category",
        "status",
        "error_class",
        "resolved_speculative_config",
        "replica_id",
        "engine_id",
        "node_id",
        "campaign",
    }
)


def read_trace_columns(root: str, columns: Sequence[str]) -> pa.Table:
    fs, base = _filesystem(root)
    partitioning = ds.partitioning(
        pa.schema([pa.field(c, pa.dictionary(pa.int32(), pa.string())) for c in PARTITION_COLUMNS]),
        flavor="hive",
        dictionaries="infer",
    )
    parquet = ds.ParquetFileFormat(
        read_options=ds.ParquetReadOptions(dictionary_columns=set(columns) & DICTIONARY_COLUMNS),
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True),
    )
    dataset = ds.dataset(
        base,
        filesystem=fs,
        format=parquet,
        partitioning=partitioning,
        exclude_invalid_files=True,
        ignore_prefixes=[".tmp-", "."],
    )
    unknown = sorted(set(columns) - set(TRACE_SCHEMA.names))
    if unknown:
        raise ValueError(f"not trace columns: {', '.join(unknown)}")
    return dataset.to_table(columns=list(columns))
