"""Open-loop arrival processes: absolute send times, seeded, independent of how fast anything answers."""

from __future__ import annotations

import numpy as np


def poisson_arrivals(rate: float, duration: float, *, seed: int, start: float = 0.0) -> np.ndarray:
    """A homogeneous Poisson process: exponential gaps with mean 1/rate, over [start, start + duration)."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if duration <= 0:
        raise ValueError(f"duration must be > 0, got {duration}")
    rng = np.random.default_rng(seed)
    expected = rate * duration
    times: list[np.ndarray] = []
    t = start
    end = start + duration
    while t < end:
        gaps = rng.exponential(1.0 / rate, size=int(expected + 6 * np.sqrt(expected) + 16))
        chunk = t + np.cumsum(gaps)
        times.append(chunk[chunk < end])
        t = float(chunk[-1])
    return np.concatenate(times)
