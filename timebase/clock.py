"""The one clock of specdrill: a monotonic clock anchored once to the Unix epoch.

Every timestamp a component records (client send times, server-side request events, engine steps) comes from
`now()`, so durations never jump with NTP and absolute times still line up across processes on one host.
"""

from __future__ import annotations

import time

_EPOCH_ANCHOR = time.time()
_MONO_ANCHOR = time.monotonic()
_EPOCH_ANCHOR_NS = round(_EPOCH_ANCHOR * 1e9)
_MONO_ANCHOR_NS = round(_MONO_ANCHOR * 1e9)


def now() -> float:
    return _EPOCH_ANCHOR + (time.monotonic() - _MONO_ANCHOR)


def now_ns() -> int:
    """`now()` in integer epoch nanoseconds (what traces store), without a float round trip."""
    return _EPOCH_ANCHOR_NS + (time.monotonic_ns() - _MONO_ANCHOR_NS)


def from_monotonic(ts: float) -> float:
    """A time.monotonic() reading from any process on this host (CLOCK_MONOTONIC is system-wide) on our clock."""
    return _EPOCH_ANCHOR + (ts - _MONO_ANCHOR)
