"""Checks of `specdrill tune`'s decisions computed in the tests, independently of tune's own scoring: whole-run
merges of a schedule, per-band p50 ratios of two played policies, the speedup a schedule gives up against an
oracle the test called itself, and that oracle's per-token latency at the batch sizes a policy's traffic ran.
Shared by the tests of tests/orchestrator/decide/test_tune*.py."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from orchestrator.analysis.opmap.bands import BandSet
from orchestrator.decide.oracle import Oracle
from orchestrator.decide.played import AnyPolicy, CampaignTraffic, Played
from orchestrator.rundir.layout import Unit
from orchestrator.virtual.traffic import play
from orchestrator.virtual.twins import arm_model
from serve_apps.policies import DynamicPolicy
from tests.tune_proof import k_at


def without_effect(
    traffic: CampaignTraffic, method: str, model: str | None, schedule: list[list[int]], played: Played, reach: int,
    bands: BandSet, reference: Oracle, top: int, margin: float,
) -> list[tuple[list[list[int]], str]]:  # fmt: skip
    """Each merge of `schedule` (merges_of) with what predicts its effect beyond the margin: "traffic" (a band's
    median over seeds of the per-token latency p50 ratio beyond it, or their total beyond one margin), "oracle"
    (more of the reference's speedup given up), or "" (nothing: a k change without a predicted effect)."""
    out = []
    for merged in merges_of(schedule, reach):
        policy = DynamicPolicy.model_validate(
            {"method": method, "model": model, "max_k": max(1, max(e[2] for e in merged)), "schedule": merged}
        )
        medians = [float(np.median(r)) for r in p50_ratios(traffic.play(policy), played, bands) if r]
        if max(medians) > 1 + margin or sum(math.log(m) for m in medians) > math.log(1 + margin):
            out.append((merged, "traffic"))
        elif given_up(reference, merged, reach, top) > given_up(reference, schedule, reach, top):
            out.append((merged, "oracle"))
        else:
            out.append((merged, ""))
    return out


def given_up(reference: Oracle, schedule: list[list[int]], reach: int, top: int) -> float:
    """The reference oracle's speedup over off given up against its best k, summed over its batch sizes up to the
    reach; 0 where the schedule's k is within its tolerance of the best."""
    total = 0.0
    for point in reference.points:
        if point.batch_size > reach:
            break
        k = min(k_at(schedule, point.batch_size, top), reference.max_k)
        if k not in point.near_best:
            off = point.tpot_p50_s[0]
            total += off / point.tpot_p50_s[point.best_k] - off / point.tpot_p50_s[k]
    return total


def merges_of(schedule: list[list[int]], reach: int) -> list[list[list[int]]]:
    """Each entry (its part up to the reach) given the k of the entry before or after it, where that leaves the
    schedule fewer entries."""
    out = []
    for i, (start, end, _) in enumerate(schedule):
        if start > reach:
            break
        for j in (i - 1, i + 1):
            if 0 <= j < len(schedule):
                dense = {b: k for s, e, k in schedule for b in range(s, e + 1)}
                dense.update({b: schedule[j][2] for b in range(start, min(end, reach) + 1)})
                merged = entries_of(dense)
                if len(merged) < len(schedule) and merged not in out:
                    out.append(merged)
    return out


def entries_of(dense: dict[int, int]) -> list[list[int]]:
    entries: list[list[int]] = []
    for b in sorted(dense):
        if entries and entries[-1][2] == dense[b]:
            entries[-1][1] = b
        else:
            entries.append([b, b, dense[b]])
    return entries


def p50_ratios(a: Played, b: Played, bands: BandSet) -> list[list[float]]:
    """Per band, per seed: a's per-token latency p50 over b's on the requests finished in both."""
    codes = bands.assign(b.offered_rate)
    both = np.isfinite(a.latency["tpot"]) & np.isfinite(b.latency["tpot"])
    out = []
    for band in range(len(bands.bands)):
        row = []
        for seed in sorted(set(b.seed.tolist())):
            mine = both & (codes == band) & (b.seed == seed)
            if mine.any():
                row.append(float(np.median(a.latency["tpot"][mine]) / np.median(b.latency["tpot"][mine])))
        out.append(row)
    return out


# --- the fixed-batch oracle at the batch sizes a played policy ran ----------------------------------------------


def batch_weights(traffic: CampaignTraffic, policy: AnyPolicy) -> dict[int, float]:
    """Per batch size, the request-steps the policy's engines ran at it over the whole traffic (every unit, every
    engine of the traffic's topology): where the tokens of the campaign's load were decoded. Replayed here through
    the virtual executor, not read from tune."""
    arm = traffic.arm("weights-single", policy)
    model = arm_model(arm)
    counts: Counter[int] = Counter()
    for shape, repeat in traffic.units:
        unit = Unit(arm=arm.name, shape=shape, repeat=repeat)
        units = traffic.traffic[(shape, repeat)]
        outcome = play(model, unit, units.plans, units, traffic.campaign.load.drain_s,
                       open_loop=traffic.campaign.shapes[shape].open_loop)  # fmt: skip
        for core in outcome.cores:
            sizes, times = np.unique(core.steps.column("batch_size"), return_counts=True)
            counts.update({int(b): int(b) * int(n) for b, n in zip(sizes, times, strict=True) if b > 0})
    return {b: float(n) for b, n in sorted(counts.items())}


def oracle_latency(reference: Oracle, k_of: Callable[[int], int], weights: dict[int, float]) -> float:
    """The reference oracle's per-token latency relative to speculation off (its tpot at k over its tpot at 0,
    interpolated between its measured batch sizes), at each batch size's k, averaged with `weights`: below 1 is
    faster than off."""
    total = sum(weights.values())
    return sum(w / reference.speedups_at(b)[min(k_of(b), reference.max_k)] for b, w in weights.items()) / total


def oracle_best(reference: Oracle, batch: int) -> int:
    speedup = reference.speedups_at(batch)
    return max(speedup, key=lambda k: (speedup[k], -k))
