"""The one clock of specdrill: a monotonic clock anchored once to the Unix epoch.

Every timestamp a component records (client send times, server-side request events, engine steps) comes from
`now()`, so durations never jump with NTP and absolute times still line up across processes on one host.
"""

from __future__ import annotations

import time

_EPOCH_ANCHOR = time.time()
_MONO_ANCHOR = time.monotonic()


def now() -> float:
    return _EPOCH_ANCHOR + (time.monotonic() - _MONO_ANCHOR)


def from_monotonic(ts: float) -> float:
    """A time.monotonic() reading from any process on this host (CLOCK_MONOTONIC is system-wide) on our clock."""
    return _EPOCH_ANCHOR + (ts - _MONO_ANCHOR)
