"""Ground truth from the simulator: for each batch size, the draft length k that minimises per-token latency.

The simulated engine knows the answer for its own profile: with `batch_size` requests always in the engine, run
k = 0 (speculation off) .. max_k and compare the median per-token latency. Verdicts, crossovers and recommended
schedules are tested against this oracle (`specdrill simulate oracle`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from loadshapes.mixes import Workload
from orchestrator.virtual.experiments import closed_batch
from serve_apps.policies import FixedPolicy, OffPolicy, validate_schedule
from serve_apps.sim.profile import Profile

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Denser where the best k changes fastest (every batch size to 16): `tune` starts from this oracle, and with
# DEFAULT_BATCH_SIZES alone a change of best k between two of them (costly-verify: 3 -> 2 at batch 6, between 4
# and 8) put a k 5.6 points of speedup short of the best into the schedule.
DENSE_BATCH_SIZES = (*range(1, 17), *range(20, 65, 4), *range(72, 129, 8), *range(144, 257, 16), 320, 384, 448, 512)


class OraclePoint(BaseModel):
    model_config = ConfigDict(frozen=True)
    batch_size: int
    tpot_p50_s: dict[int, float]  # k -> median per-token latency (k = 0: speculation off)
    tokens_per_s: dict[int, float]
    mean_batch: dict[int, float]  # the running batch the engine really held (below batch_size when KV-bound)
    best_k: int
    # How much slower the runner-up k is than the best (relative): small margins are where boundaries may move.
    margin: float
    near_best: tuple[int, ...]  # every k within the oracle's tolerance of the best: a tie within its own noise


class Oracle(BaseModel):
    model_config = ConfigDict(frozen=True)
    profile: str
    workload: str
    method: str
    max_k: int
    seed: int
    tolerance: float
    points: tuple[OraclePoint, ...]

    def best_k(self, batch_size: int) -> int:
        """The best k of the largest measured batch size <= batch_size (the one below 1 is batch 1)."""
        below = [p for p in self.points if p.batch_size <= batch_size]
        return (below[-1] if below else self.points[0]).best_k

    def speedups_at(self, batch_size: int) -> dict[int, float]:
        """Per k, off's per-token latency over k's at this batch size: each k's latency interpolated linearly
        between the measured batch sizes (held flat beyond the first and last)."""
        sizes = [p.batch_size for p in self.points]
        tpot = {
            k: float(np.interp(batch_size, sizes, [p.tpot_p50_s[k] for p in self.points]))
            for k in range(self.max_k + 1)
        }
        return {k: tpot[0] / tpot[k] for k in tpot}

    def schedule(self) -> list[list[int]]:
        """vLLM's num_speculative_tokens_per_batch_size form: each measured batch size holds until the next."""
        entries: list[list[int]] = []
        for point, following in zip(self.points, [*self.points[1:], None], strict=True):
            end = following.batch_size - 1 if following is not None else point.batch_size
            if entries and entries[-1][2] == point.best_k:
                entries[-1][1] = end
            else:
                entries.append([point.batch_size, end, point.best_k])
        if entries:
            entries[0][0] = 1  # vLLM's schedules start at batch 1
        validate_schedule(entries)
        return entries


def oracle(
    profile: Profile,
    *,
    workload: Workload,
    max_k: int,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    seed: int = 0,
    rounds: int = 6,
    tolerance: float = 0.01,
    progress: Callable[[int, int], None] | None = None,
) -> Oracle:
    """`progress(done, total)`: called after each batch size (tune says how far a long build got)."""
    limit = profile.limits.max_draft_tokens
    if limit is not None and max_k > limit:  # a fitted profile's: past it its acceptance was never measured
        raise ValueError(
            f"k up to {max_k} asked of profile {profile.name}, whose limits.max_draft_tokens is {limit} "
            f"(the longest draft it models; a fitted profile's: the longest measured): use k <= {limit}"
        )
    sizes = sorted({b for b in batch_sizes if b <= profile.limits.max_num_seqs})
    if not sizes:
        raise ValueError(f"no batch size within the profile's max_num_seqs {profile.limits.max_num_seqs}")
    drafter = {"method": profile.drafter_method, "model": profile.drafter_model}
    points = []
    for batch in sizes:
        tpot: dict[int, float] = {}
        rate: dict[int, float] = {}
        held: dict[int, float] = {}
        for k in range(max_k + 1):
            policy = OffPolicy() if k == 0 else FixedPolicy.model_validate({**drafter, "k": k})
            result = closed_batch(profile, policy, batch_size=batch, workload=workload, seed=seed, rounds=rounds)
            tpot[k], rate[k], held[k] = result.tpot_p50_s, result.tokens_per_s, result.mean_batch
        # best_k: the smallest latency, equal latencies to the smaller k. k within `tolerance` of it are listed in
        # near_best and not ranked here: `tune` decides among them by its own tie rule (decide/scoring.py).
        ranked = sorted(tpot, key=lambda k: (tpot[k], k))
        best = ranked[0]
        if not tpot[best] > 0:  # a profile whose steps take no time (refused when a profile is loaded)
            raise ValueError(f"profile {profile.name!r}: per-token latency 0 s at batch {batch}: no step costs time")
        margin = tpot[ranked[1]] / tpot[best] - 1.0 if len(ranked) > 1 else 0.0
        near = tuple(k for k in sorted(tpot) if tpot[k] <= tpot[best] * (1.0 + tolerance))
        points.append(
            OraclePoint(
                batch_size=batch,
                tpot_p50_s=tpot,
                tokens_per_s=rate,
                mean_batch=held,
                best_k=best,
                margin=margin,
                near_best=near,
            )
        )
        if progress is not None:
            progress(len(points), len(sizes))
    return Oracle(
        profile=profile.name, workload=workload.name, method=profile.drafter_method, max_k=max_k, seed=seed,
        tolerance=tolerance, points=tuple(points),
    )  # fmt: skip
