"""List columns (one list per request) as flat numpy arrays, so per-request reductions need no Python loop."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.analysis.list_kernels import sum_lists


@dataclass(frozen=True)
class FlatList:
    values: np.ndarray  # every element, request after request
    offsets: np.ndarray  # int64, one more than requests: request i owns values[offsets[i]:offsets[i + 1]]

    @cached_property  # read many times, slice by slice: one diff of the offsets, not one per read
    def lengths(self) -> np.ndarray:
        lengths: np.ndarray = np.diff(self.offsets)
        return lengths

    def parents(self) -> np.ndarray:
        """The request each element belongs to."""
        parents: np.ndarray = np.repeat(np.arange(len(self.offsets) - 1, dtype=np.int64), self.lengths)
        return parents

    def positions(self) -> np.ndarray:
        """Each element's position inside its own list."""
        positions: np.ndarray = np.arange(len(self.values), dtype=np.int64) - np.repeat(self.offsets[:-1], self.lengths)
        return positions

    def sums(self, values: np.ndarray | None = None) -> np.ndarray:
        """Per-request sums of `values` (default: the elements), 0 for an empty list."""
        chosen = self.values if values is None else values
        if np.issubdtype(chosen.dtype, np.floating):
            running = np.zeros(len(chosen) + 1)
            np.cumsum(chosen, out=running[1:])
            float_sums: np.ndarray = running[self.offsets[1:]] - running[self.offsets[:-1]]
            return float_sums
        # A 32-bit running sum may wrap around, but the difference of two wrapped sums is still exact for any
        # one list whose own sum fits in 32 bits: half the memory traffic of 64 bits, on tens of millions of steps.
        wrapped = np.zeros(len(chosen) + 1, dtype=np.int32)
        np.cumsum(chosen, dtype=np.int32, out=wrapped[1:])
        sums: np.ndarray = (wrapped[self.offsets[1:]] - wrapped[self.offsets[:-1]]).astype(np.int64)
        return sums


def _chunk_lists(chunk: pa.ListArray | pa.LargeListArray) -> tuple[pa.Array, np.ndarray]:
    """(the elements the chunk's lists span, offsets into them from 0)."""
    if chunk.null_count:
        # A null list may still span child elements: only flatten() is sure to drop them.
        offsets = np.zeros(len(chunk) + 1, dtype=np.int64)
        np.cumsum(pc.list_value_length(chunk).fill_null(0).to_numpy(), out=offsets[1:])
        return chunk.flatten(), offsets
    raw = np.frombuffer(chunk.buffers()[1], dtype=np.int64 if pa.types.is_large_list(chunk.type) else np.int32)
    spans: np.ndarray = raw[chunk.offset : chunk.offset + len(chunk) + 1]
    return chunk.values.slice(spans[0], spans[-1] - spans[0]), spans - spans[0]


def _elements(values: pa.Array) -> np.ndarray:
    elements: np.ndarray = values.fill_null(0).to_numpy() if values.null_count else values.to_numpy()
    return elements


def flat_list(column: pa.ChunkedArray | pa.Array) -> FlatList:
    """A null list counts as empty; null elements become 0."""
    chunks = [c for c in (column.chunks if isinstance(column, pa.ChunkedArray) else [column]) if len(c)]
    parts = [_chunk_lists(chunk) for chunk in chunks]
    # Straight into the final arrays: no per-chunk flattened copy concatenated afterwards.
    offsets = np.zeros(len(column) + 1, dtype=np.int64)
    values = np.empty(sum(int(o[-1]) for _, o in parts), dtype=column.type.value_type.to_pandas_dtype())
    row = 0
    for chunk_values, chunk_offsets in parts:
        start = offsets[row]
        offsets[row + 1 : row + len(chunk_offsets)] = chunk_offsets[1:] + start
        values[start : start + chunk_offsets[-1]] = _elements(chunk_values)
        row += len(chunk_offsets) - 1
    return FlatList(values=values, offsets=offsets)


_KERNEL_VALUES = {pa.int16(): np.int16, pa.int32(): np.int32}  # the trace schema's list element types


def _kernel_sums(chunk: pa.ListArray, positive: bool, sums: np.ndarray, lengths: np.ndarray) -> bool:
    """Sums straight from the chunk's Arrow buffers (compiled, no running-sum or null-filled copy); False when
    the chunk is of a kind the kernel does not take."""
    value_type = _KERNEL_VALUES.get(chunk.type.value_type)
    if chunk.null_count or not pa.types.is_list(chunk.type) or value_type is None:
        return False
    child = chunk.values
    validity, data = child.buffers()[:2]
    if data is None:
        return False
    offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[chunk.offset : chunk.offset + len(chunk) + 1]
    values = np.frombuffer(data, dtype=value_type)[child.offset : child.offset + len(child)]
    bitmap = np.frombuffer(validity, dtype=np.uint8) if validity is not None and child.null_count else _NO_BITMAP
    sum_lists(values, offsets, bitmap, child.offset, positive, sums, lengths)
    return True


_NO_BITMAP = np.zeros(0, dtype=np.uint8)


def _chunk_sums(chunk: pa.ListArray | pa.LargeListArray, positive: bool) -> tuple[np.ndarray, np.ndarray]:
    values, offsets = _chunk_lists(chunk)
    lengths = np.diff(offsets)
    elements = _elements(values)
    if positive:
        elements = elements > 0
    # Chunk by chunk, so the running sum stays in cache; 32 bits wrap, but the difference of two wrapped sums is
    # exact for any one list whose own sum fits in 32 bits.
    running = np.zeros(len(elements) + 1, dtype=np.int32)
    np.cumsum(elements, dtype=np.int32, out=running[1:])
    sums: np.ndarray = running[offsets[1:]] - running[offsets[:-1]]
    return sums, lengths


def list_sums(column: pa.ChunkedArray | pa.Array, *, positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(per-list sum, per-list length) as int32, without flattening the whole column: a null list counts as
    empty, a null element as 0; `positive` counts the elements above 0 instead of summing them."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    sums, lengths = np.empty(len(column), dtype=np.int32), np.empty(len(column), dtype=np.int32)
    start = 0
    for chunk in chunks:
        if len(chunk):
            part = slice(start, start + len(chunk))
            if not _kernel_sums(chunk, positive, sums[part], lengths[part]):
                sums[part], lengths[part] = _chunk_sums(chunk, positive)
            start += len(chunk)
    return sums, lengths
