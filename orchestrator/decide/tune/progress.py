"""What `specdrill tune` says while it searches (minutes on a campaign of a few minutes of traffic): a line per
stage, and within a long stage a line every few seconds with how far it got. The words only; the command prints
them to stderr, apart from its answer on stdout."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

EVERY_S = 5.0  # within a stage, a line at most this often


@dataclass
class TuneProgress:
    say: Callable[[str], None]
    every_s: float = EVERY_S
    clock: Callable[[], float] = time.monotonic
    began: float = field(init=False)
    last: float = field(init=False)

    def __post_init__(self) -> None:
        self.began = self.last = self.clock()

    def stage(self, text: str) -> None:
        """A stage begins: always said."""
        self.last = self.clock()
        self.say(f"tune: {text} ({self.last - self.began:.0f} s)")

    def step(self, text: str, done: int, total: int | None = None, *, always: bool = False) -> None:
        """How far a stage got: said when `always`, else at most every `every_s` seconds."""
        now = self.clock()
        if not always and now - self.last < self.every_s:
            return
        self.last = now
        count = f"{done}/{total}" if total is not None else f"{done}"
        self.say(f"tune: {text} ... {count} ({now - self.began:.0f} s)")


def silent() -> TuneProgress:
    return TuneProgress(say=lambda _line: None)
