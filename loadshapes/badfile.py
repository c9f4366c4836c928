"""A file a command reads or writes that is missing, truncated, corrupt or of the wrong kind: one error type that
carries the file's path and the problem, raised where the file is opened, so the command line turns it into one
line and exit code 2 (orchestrator.cli) instead of a traceback from Arrow, DuckDB or json.

Local paths and pyarrow filesystem URIs alike (loadshapes.trace.filesystem).
"""

from __future__ import annotations

import errno
import os

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


class BadFileError(ValueError):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def first_line(exc: BaseException) -> str:
    """The reader's own words, on one line: Arrow's and DuckDB's messages run over several."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__).strip()


def os_problem(exc: OSError) -> str:
    """What the operating system said, in its words (`Not a directory`, `Permission denied`), without the
    path Arrow repeats ("[Errno 20] Cannot create directory '...'. Detail: ...")."""
    if exc.errno is not None and exc.errno in errno.errorcode:
        return os.strerror(exc.errno)
    return first_line(exc)


def kind(fs: pafs.FileSystem, path: str) -> pafs.FileType:
    return fs.get_file_info(path).type


def require_file(fs: pafs.FileSystem, path: str, what: str) -> None:
    """`path` is a regular file, or one line saying what it is instead."""
    found = kind(fs, path)
    if found == pafs.FileType.NotFound:
        raise BadFileError(path, f"missing ({what})")
    if found != pafs.FileType.File:
        raise BadFileError(path, f"is a directory, expected a file ({what})")


def require_directory(fs: pafs.FileSystem, path: str, what: str) -> None:
    found = kind(fs, path)
    if found == pafs.FileType.NotFound:
        raise BadFileError(path, f"no such directory ({what})")
    if found != pafs.FileType.Directory:
        raise BadFileError(path, f"is a file, expected a directory ({what})")


def make_directory(fs: pafs.FileSystem, path: str, what: str) -> None:
    """Create `path` and its parents, or one line saying why not (a regular file in the way, /proc, no
    permission, a read-only disk)."""
    found = kind(fs, path)
    if found == pafs.FileType.Directory:
        return
    if found == pafs.FileType.File:
        raise BadFileError(path, f"is a file, expected a directory ({what})")
    try:
        fs.create_dir(path, recursive=True)
    except OSError as exc:
        parent = path.rstrip("/").rsplit("/", 1)[0] or "/"
        if exc.errno == errno.ENOENT and kind(fs, parent) == pafs.FileType.Directory:
            # /proc, /sys: the parent is there and still says "No such file or directory"
            refused = f"{parent} takes no new directory ({os_problem(exc)})"
            raise BadFileError(path, f"cannot create the {what}: {refused}") from None
        raise BadFileError(path, f"cannot create the {what}: {os_problem(exc)}") from None


def write_failed(path: str, exc: OSError) -> BadFileError:
    return BadFileError(path, f"cannot write: {os_problem(exc)}")


def parquet_metadata(fs: pafs.FileSystem, path: str, what: str) -> pq.FileMetaData:
    """A Parquet file's footer, or one line naming the file: truncated or not Parquet at all (no magic bytes, a
    footer that does not decode), a directory, missing."""
    try:
        with fs.open_input_file(path) as handle:
            return pq.read_metadata(handle)
    except (pa.ArrowException, OSError) as exc:
        raise parquet_problem(fs, path, what, exc) from None


def parquet_problem(fs: pafs.FileSystem, path: str, what: str, exc: BaseException) -> BadFileError:
    """The one line for a Parquet file a reader (Arrow, DuckDB) failed on."""
    require_file(fs, path, what)
    return BadFileError(path, f"not a readable Parquet file ({what}): {first_line(exc)}")
