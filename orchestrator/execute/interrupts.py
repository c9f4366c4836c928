"""Ctrl-C (SIGINT) and SIGTERM during a campaign: one exception, raised where the run is, so the command stops
through its own `finally` blocks (arms torn down, load workers stopped) and can say how far it got.

A unit's marker is its last write and atomic (orchestrator.rundir.layout), so a unit cut short is never complete and a
rerun redoes it from scratch.

Python runs a signal handler between two bytecodes of the main thread, wherever it is; when that is inside a
finalizer (a `__del__`, a weakref callback, run by the garbage collector) the exception cannot leave it: Python
prints "Exception ignored in ..." and goes on. So the handler also keeps the signal, and `raise_pending` raises it
again at the points that must not pass a stop: before a unit's marker is written, every second of a real-time
unit's load, and at the end of the block (seen in CI: a SIGTERM landed in a finalizer, the run finished, exit 0).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """BaseException, as KeyboardInterrupt is: no `except Exception` on the way out may swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


_pending: list[Stopped] = []  # the signal received in the current block, kept until the block ends


def raise_pending() -> None:
    """Raise the stop a signal asked for, if its first raise was swallowed (see the module's note)."""
    if _pending:
        raise _pending[0]


@contextmanager
def stop_on_signals(announce: Callable[[Stopped], None] | None = None) -> Iterator[None]:
    """Within the block SIGINT and SIGTERM raise Stopped; the previous handlers are back after it. `announce` is
    called first, before any cleanup runs: whoever sent SIGTERM may send SIGKILL a few seconds later (`ray job
    stop` does after 3 s), and the words are out by then. Outside the main thread (where Python allows no
    handler) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_stopped(signum: int, _frame: FrameType | None) -> None:
        if _pending:  # a second signal while the first one's stop is on its way out: the same stop
            raise _pending[0]
        stopped = Stopped(signum)
        _pending.append(stopped)
        if announce is not None:
            announce(stopped)
        raise stopped

    def quiet_when_stopped(unraisable: sys.UnraisableHookArgs) -> None:
        # A stop swallowed in a finalizer is raised again by raise_pending; its traceback would only alarm.
        if not isinstance(unraisable.exc_value, Stopped):
            previous_hook(unraisable)

    previous = {s: signal.signal(s, raise_stopped) for s in SIGNALS}
    previous_hook, sys.unraisablehook = sys.unraisablehook, quiet_when_stopped
    try:
        yield
        raise_pending()
    except Exception:
        # A library that catches the signal's stop and raises its own error instead (DuckDB: "RuntimeError: Query
        # interrupted", or a reader's error about the file it was scanning): the stop it was.
        if _pending:
            raise _pending[0] from None
        raise
    finally:
        _pending.clear()
        sys.unraisablehook = previous_hook
        for s, handler in previous.items():
            signal.signal(s, handler)
