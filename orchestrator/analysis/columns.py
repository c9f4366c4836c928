"""Arrow columns into numpy arrays with one copy, chunk by chunk into the final array."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _valid(chunk: pa.Array) -> np.ndarray:
    bitmap = np.frombuffer(chunk.buffers()[0], dtype=np.uint8)
    valid: np.ndarray = np.unpackbits(bitmap, bitorder="little")[chunk.offset : chunk.offset + len(chunk)].view(bool)
    return valid


def float_column(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """float64, NaN for null; pyarrow's own conversion makes a filled copy per chunk and then concatenates."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out = np.empty(len(column), dtype=np.float64)
    start = 0
    for chunk in chunks:
        part = out[start : start + len(chunk)]
        start += len(chunk)
        if not len(chunk):
            continue
        if pa.types.is_float64(chunk.type) and chunk.buffers()[1] is not None:
            part[:] = np.frombuffer(chunk.buffers()[1], dtype=np.float64)[chunk.offset : chunk.offset + len(chunk)]
            if chunk.null_count:
                part[~_valid(chunk)] = np.nan
        else:
            part[:] = chunk.to_numpy(zero_copy_only=False)
    return out
