"""Open-loop arrival processes: absolute send times, seeded, independent of how fast anything answers."""

from __future__ import annotations

import numpy as np

from loadshapes.shapes import Replay, ShapeBase


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


def renewal_gaps(process: str, n: int, rng: np.random.Generator, *, cv: float = 1.0) -> np.ndarray:
    """n gaps of a unit-rate renewal process: poisson (exponential), gamma (burstiness cv), constant."""
    if process == "poisson":
        return rng.exponential(1.0, size=n)
    if process == "gamma":
        if not cv > 0:
            raise ValueError(f"gamma arrivals need cv > 0, got {cv}")
        shape = 1.0 / (cv * cv)  # mean 1, coefficient of variation cv
        return rng.gamma(shape, 1.0 / shape, size=n)
    if process == "constant":
        return np.ones(n)
    raise ValueError(f"unknown arrival process {process!r}: poisson, gamma or constant")


def shape_arrivals(shape: ShapeBase, *, process: str = "poisson", seed: int, cv: float = 1.0) -> np.ndarray:
    """Absolute send offsets for an open-loop shape, by time rescaling.

    Unit-rate renewal events in operational time s are mapped through the inverse of Lambda(t), the integral of
    the shape's rate; for linear segments the inverse is closed-form. With process="poisson" this is an
    inhomogeneous Poisson process with intensity rate(t). A `replay` shape gives its file's offsets as they are
    (process, seed and cv do not apply).
    """
    if not shape.open_loop:
        raise ValueError(f"shape {shape.kind!r} is closed loop: it has users, not arrival times")
    if isinstance(shape, Replay):
        return shape.offsets().copy()
    total = float(shape.expected_requests)
    rng = np.random.default_rng(seed)
    chunks: list[np.ndarray] = []
    s = 0.0
    while s < total:
        n = int(max(16, (total - s) * 1.2 + 6 * np.sqrt(max(total - s, 1.0))))
        events = s + np.cumsum(renewal_gaps(process, n, rng, cv=cv))
        chunks.append(events[events < total])
        s = float(events[-1])
    operational = np.concatenate(chunks) if chunks else np.zeros(0)
    phases = shape.phases()
    edges = shape.boundaries()
    before = np.concatenate([[0.0], np.cumsum([p.expected_requests for p in phases])])
    index = np.clip(np.searchsorted(before, operational, side="right") - 1, 0, len(phases) - 1)
    r0 = np.array([p.rate_start for p in phases])[index]
    slope = np.array([(p.rate_end - p.rate_start) / p.duration for p in phases])[index]
    need = operational - before[index]
    with np.errstate(divide="ignore", invalid="ignore"):
        quadratic = (-r0 + np.sqrt(np.maximum(r0 * r0 + 2.0 * slope * need, 0.0))) / slope
        x = np.where(np.abs(slope) > 1e-12, quadratic, need / np.where(r0 > 0, r0, 1.0))
    offsets: np.ndarray = np.minimum(edges[index] + x, shape.duration)
    return offsets


def worker_share(times: np.ndarray, worker: int, workers: int) -> np.ndarray:
    """Worker `worker` of `workers` sends every workers-th arrival: the union is the same traffic for any split."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} outside 0..{workers - 1}")
    return times[worker::workers]
