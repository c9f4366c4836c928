"""Reading data set files in bounded memory: the byte offset of every record (an element of a top-level JSON list,
or a JSONL line), so a sampler keeps offsets (8 bytes a record) and decodes only the records it sends.

A ShareGPT file is one JSON list (vLLM json.loads it whole: 125 MB of text is ~1 GB of Python objects); here it is
decoded an element at a time from a window of at most MAX_RECORD_BYTES, so a 2 GB file costs its offsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

CHUNK = 1 << 20
# One record larger than this is refused: the window a record is decoded from is this big at most.
MAX_RECORD_BYTES = 64 << 20
_DECODER = json.JSONDecoder()
_SPACE = b" \t\r\n"


class DatasetError(ValueError):
    """A data set file that cannot be used: the message is one line naming the file (and record) and the problem."""


class _Window:
    """A window onto the file: `data[pos:]` is what is not consumed yet; more is read (and the consumed part
    dropped) only when a record does not fit in what is there."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.data = b""
        self.base = 0  # file offset of data[0]
        self.pos = 0
        self.eof = False

    def more(self) -> bool:
        chunk = self.handle.read(CHUNK)
        self.eof = not chunk
        self.base += self.pos
        self.data = self.data[self.pos :] + chunk
        self.pos = 0
        return bool(chunk)

    def skip_space(self) -> bytes:
        """The next non-space byte (b"" at the end of the file), not consumed."""
        while True:
            while self.pos < len(self.data) and self.data[self.pos] in _SPACE:
                self.pos += 1
            if self.pos < len(self.data) or not self.more():
                return self.data[self.pos : self.pos + 1]


def array_records(path: str) -> Iterator[tuple[int, Any]]:
    """(byte offset, decoded element) for each element of the file's top-level JSON list, in order."""
    with open(path, "rb") as handle:
        window = _Window(handle)
        if window.skip_space() == b"\xef" and window.data[window.pos : window.pos + 3] == b"\xef\xbb\xbf":
            window.pos += 3
        first = window.skip_space()
        if first != b"[":
            raise DatasetError(f"{path}: not a JSON list (it starts with {window.data[window.pos :][:20]!r})")
        window.pos += 1
        index = 0
        while True:
            next_byte = window.skip_space()
            if next_byte == b"]":
                return
            if not next_byte:
                raise DatasetError(f"{path}: truncated: the JSON list ends after {index} records without its `]`")
            if index > 0:
                if next_byte != b",":
                    where = window.base + window.pos
                    raise DatasetError(f"{path}: record {index + 1} (byte {where}): expected `,` or `]`")
                window.pos += 1
                window.skip_space()
            offset = window.base + window.pos
            yield offset, _decode_one(path, window, index, offset)
            index += 1


def _decode_one(path: str, window: _Window, index: int, offset: int) -> Any:
    """The element at the window's position, decoding a prefix that doubles until the element fits (reading more
    of the file where the window ends), so a record costs about its own size, not the window's."""
    size = 4096
    while True:
        piece = window.data[window.pos : window.pos + size]
        text = _text(path, piece, offset)
        try:
            value, end_char = _DECODER.raw_decode(text)
        except json.JSONDecodeError as exc:
            if window.pos + size < len(window.data):
                size *= 2
                continue
            if size > MAX_RECORD_BYTES:
                raise DatasetError(
                    f"{path}: record {index + 1} (byte {offset}): over {MAX_RECORD_BYTES >> 20} MiB, or not JSON"
                ) from None
            if window.eof or not window.more():
                raise DatasetError(
                    f"{path}: record {index + 1} (byte {offset}): not complete JSON ({exc.msg}): the file is "
                    "truncated or the record malformed"
                ) from None
            continue
        window.pos += len(text[:end_char].encode("utf-8"))
        return value


def _text(path: str, piece: bytes, offset: int) -> str:
    """The piece as text, less a character its end cuts in two; bytes that are not UTF-8 are one line."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(piece) - 3 and exc.reason == "unexpected end of data":
            return piece[: exc.start].decode("utf-8")
        raise DatasetError(f"{path}: byte {offset + exc.start}: not UTF-8 text") from None


def line_records(path: str) -> Iterator[tuple[int, int, Any]]:
    """(byte offset, line number, decoded object) for each non-blank line of a JSONL file."""
    offset = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            here, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                yield here, number, json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DatasetError(f"{path}:{number}: not JSON ({str(exc).splitlines()[0]})") from None


def record_at(path: str, offset: int, jsonl: bool) -> Any:
    """The record that starts at `offset` (read again when it is sent): a read that starts at 16 KiB and doubles,
    so a request costs about its record's size, not a window's."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        if jsonl:
            return json.loads(handle.readline())
        buffer = handle.read(16 << 10)
        while True:
            try:
                return _DECODER.raw_decode(_text(path, buffer, offset))[0]
            except json.JSONDecodeError:
                more = handle.read(len(buffer))
                if not more or len(buffer) > MAX_RECORD_BYTES:
                    raise DatasetError(f"{path}: byte {offset}: the record changed since it was read") from None
                buffer += more
