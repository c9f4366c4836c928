"""Request ids `{arm}:{shape}:{repeat}:{index}` (loadshapes/plan.py): the same request in every arm shares
(shape, repeat, index), which pairs it across arms.

The ids are parsed from Arrow's raw string buffers by a small compiled kernel (numba, as the simulator's
kernel is): string splits or numpy byte gathers cost seconds per 10 million ids, the kernel a fraction of one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numba import njit, types

_MAX_PLACE = 10**17  # 18 digits: any larger index would overflow int64


@dataclass(frozen=True)
class ParsedIds:
    repeat: np.ndarray  # int64, -1 where the id does not end in ':{repeat}:{index}' after a non-empty arm part
    index: np.ndarray  # int64, -1 likewise


_BYTES = types.Array(types.uint8, 1, "C", readonly=True)  # Arrow's buffers, as np.frombuffer gives them
_OFFSETS = [types.Array(width, 1, "C", readonly=True) for width in (types.int32, types.int64)]
_OUT = types.Array(types.int64, 1, "C")


# Signatures given, so the kernel is compiled (or loaded from numba's cache) at import, not on first use.
@njit([types.void(_BYTES, offsets, _OUT, _OUT) for offsets in _OFFSETS], cache=True, nogil=True)  # type: ignore[untyped-decorator]
def _parse(data: np.ndarray, offsets: np.ndarray, repeat: np.ndarray, index: np.ndarray) -> None:  # pragma: no cover
    for i in range(len(offsets) - 1):
        start = offsets[i]
        pos = offsets[i + 1] - 1
        numbers = 0
        value = 0
        place = 1
        last = -1
        repeat[i] = -1
        index[i] = -1
        while pos >= start:
            byte = data[pos]
            if byte == 58:  # ':' closes a number read right to left
                if place == 1:
                    break
                if numbers == 0:
                    last = value
                elif pos > start:  # an empty arm part is not an id
                    repeat[i] = value
                    index[i] = last
                    break
                else:
                    break
                numbers += 1
                value = 0
                place = 1
            elif 48 <= byte <= 57 and place <= _MAX_PLACE:
                value += (byte - 48) * place
                place *= 10
            else:
                break
            pos -= 1


def parse_request_ids(ids: pa.ChunkedArray | pa.Array) -> ParsedIds:
    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    # The kernel writes each chunk's ids straight into its slice of the full arrays: no per-chunk copies to join.
    repeats = np.full(len(ids), -1, dtype=np.int64)
    indices = np.full(len(ids), -1, dtype=np.int64)
    start = 0
    for chunk in chunks:
        if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
            chunk = chunk.cast(pa.large_string())
        n = len(chunk)
        repeat, index = repeats[start : start + n], indices[start : start + n]
        start += n
        if n:
            _, offsets_buffer, data_buffer = chunk.buffers()
            width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
            offsets = np.frombuffer(offsets_buffer, dtype=width)[chunk.offset : chunk.offset + n + 1]
            if data_buffer is not None and offsets[-1] > offsets[0]:
                _parse(np.frombuffer(data_buffer, dtype=np.uint8), offsets, repeat, index)
            if chunk.null_count:
                invalid = chunk.is_null().to_numpy(zero_copy_only=False)
                repeat[invalid] = -1
                index[invalid] = -1
    return ParsedIds(repeat=repeats, index=indices)
