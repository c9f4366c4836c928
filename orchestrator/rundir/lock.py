"""One writer per run directory: `writer.lock` in the run directory names the process that writes it (pid, host,
the process's start, the command), created atomically by the writer that opens the run and removed when it
finishes.

Two writers in one directory would each write every unit (the second's rerun of a unit removes the first's
part files mid-write, or both markers vouch for rows the other also wrote: the report counted every request
twice). A second writer is refused in one line naming the holder. A lock whose process is gone (same host, the
pid not running, or running but started at another time: a reused pid) is stale: it is named and taken over. A
lock from another host cannot be checked from here: it is named and refused unless the operator forces it
(`--force-lock`), having made sure that run is gone.

Local directories are locked with an atomic link (a lock is never seen half-written); a pyarrow filesystem URI
(an object store has no atomic create) is checked, then written: best effort, said in docs/operator/running.md.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
import uuid
from contextlib import suppress
from typing import Any

from pyarrow.fs import FileType, LocalFileSystem
from pydantic import BaseModel, ConfigDict, ValidationError

from loadshapes.badfile import BadFileError

LOCK = "writer.lock"
TAKEOVER_TRIES = 5


class LockRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    pid: int
    host: str
    started: str  # when the writer took the lock, UTC, for the operator
    process_start: int | None = None  # /proc/<pid>/stat's start time (clock ticks since boot): a reused pid differs
    command: str = ""
    token: str  # this lock's own id: a writer removes only the lock it took

    def holder(self) -> str:
        what = f" ({self.command})" if self.command else ""
        return f"pid {self.pid} on host {self.host} since {self.started}{what}"


class _Policy:
    force_foreign = False  # --force-lock: take over a lock held on another host


_policy = _Policy()
_held: dict[str, tuple[Any, str, str]] = {}  # run root -> (filesystem, lock path, token) of locks this process holds


def force_foreign_locks(force: bool = True) -> None:
    """`--force-lock`: a lock held on another host is taken over instead of refused (the operator checked)."""
    _policy.force_foreign = force


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None where it cannot be read (no such process,
    no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[19])  # field 22 of stat; fields[0] is field 3 (the state)
    except (OSError, IndexError, ValueError):
        return None


def running(record: LockRecord) -> bool:
    """The lock's process is still running on this host (a reused pid is not it)."""
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    started = process_start(record.pid)
    return record.process_start is None or started is None or started == record.process_start


def _command() -> str:
    """What the holder runs, for the operator: `specdrill simulate CAMPAIGN` (the command and its first argument)."""
    return " ".join(["specdrill", *sys.argv[1:3]])[:120]


def _record() -> LockRecord:
    return LockRecord(
        pid=os.getpid(), host=socket.gethostname(), started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        process_start=process_start(os.getpid()), command=_command(), token=uuid.uuid4().hex,
    )  # fmt: skip


def _create(fs: Any, path: str, record: LockRecord) -> bool:
    """Write the lock where there is none; False when another writer's is there."""
    text = record.model_dump_json()
    if isinstance(fs, LocalFileSystem):
        temporary = f"{path}.{record.token}"
        with open(temporary, "w", encoding="utf-8") as out:
            out.write(text)
        try:
            os.link(temporary, path)  # atomic, and the lock is whole when it appears
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(temporary)
    if fs.get_file_info(path).type != FileType.NotFound:
        return False
    with fs.open_output_stream(path) as sink:
        sink.write(text.encode())
    return True


def _read(fs: Any, path: str) -> LockRecord | None:
    """The lock there, None where it vanished (its writer finished); one line where it is not a lock."""
    try:
        with fs.open_input_stream(path) as stream:
            raw = stream.read()
    except FileNotFoundError:
        return None
    try:
        return LockRecord.model_validate(json.loads(raw.decode()))
    except (UnicodeDecodeError, json.JSONDecodeError, ValidationError):
        raise BadFileError(path, "not a specdrill writer lock (unreadable): if no run is writing this directory, "
                                 "delete it")  from None  # fmt: skip


def _take_over(fs: Any, path: str, stale: LockRecord) -> bool:
    """Move the stale lock aside and create ours; False when another writer took it over first."""
    aside = f"{path}.stale-{uuid.uuid4().hex[:8]}"
    try:
        fs.move(path, aside)
    except (FileNotFoundError, OSError):
        return False
    moved = _read(fs, aside)
    fs.delete_file(aside)
    if moved is not None and moved.token != stale.token:  # a fresh lock went up meanwhile: put it back
        _create(fs, path, moved)
        return False
    return True


def acquire(fs: Any, base: str, root: str, say: Any = None) -> None:
    """Take the run directory's writer lock, or one line naming its holder (BadFileError: exit 2). `say` gets the
    one line about a stale lock taken over. A lock this process took earlier (a run that stopped with an error in
    the same process) is taken again."""
    path = f"{base}/{LOCK}"
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    mine = _record()
    for _ in range(TAKEOVER_TRIES):
        if _create(fs, path, mine):
            _held[root] = (fs, path, mine.token)
            atexit.register(release_all)
            return
        found = _read(fs, path)
        if found is None:
            continue  # its writer finished meanwhile
        here = found.host == mine.host
        if here and found.pid == mine.pid:
            reason = ""  # this process's own lock, left by a run that stopped with an error
        elif here and running(found):
            raise BadFileError(path, f"another writer holds this run directory: {found.holder()}; wait "
                                     "for it to finish or use another --output")  # fmt: skip
        elif here:
            reason = "stale lock (that process is no longer running)"
        elif _policy.force_foreign:
            reason = "lock of another host, taken over as --force-lock asked"
        else:
            raise BadFileError(path, f"this run directory is being written from another host: {found.holder()}; "
                                     "if that run is gone, rerun with --force-lock")  # fmt: skip
        if _take_over(fs, path, found) and _create(fs, path, mine):
            if reason:
                say(f"specdrill: {path}: {reason}: {found.holder()}; taken over")
            _held[root] = (fs, path, mine.token)
            atexit.register(release_all)
            return
    raise BadFileError(path, "could not be taken: other writers kept taking it over; retry")


def release(root: str) -> None:
    """Remove this process's lock on the run directory, only if it is still ours."""
    held = _held.pop(root, None)
    if held is None:
        return
    fs, path, token = held
    with suppress(OSError, BadFileError):
        found = _read(fs, path)
        if found is not None and found.token == token:
            fs.delete_file(path)


def release_all() -> None:
    for root in list(_held):
        release(root)


def holds(root: str) -> bool:
    return root in _held
