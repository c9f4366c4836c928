"""Ctrl-C (SIGINT) and SIGTERM during a campaign: one exception, raised where the run is, so the command stops
through its own `finally` blocks (arms torn down, load workers stopped) and can say how far it got.

A unit's marker is its last write and atomic (orchestrator.rundir), so a unit cut short is never complete and a
rerun redoes it from scratch.
"""

from __future__ import annotations

import signal
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
        stopped = Stopped(signum)
        if announce is not None:
            announce(stopped)
        raise stopped

    previous = {s: signal.signal(s, raise_stopped) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
