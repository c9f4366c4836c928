"""The space `tune` searches: one k per edge (segment start) up to the largest batch the traffic reached, the
oracle's k kept above it; the neighbours a climb steps to, the merges that simplify a schedule, and what the tie
rule measures of a table (its segments, the oracle's prior, its k mass)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.decide.tune.simplify import runs_of
from serve_apps.policies import DynamicPolicy, dense_schedule

KTable = tuple[int, ...]  # one k per edge of the space


@dataclass(frozen=True)
class Space:
    edges: tuple[int, ...]  # segment starts, edges[0] == 1, all <= reach
    reach: int  # the largest batch the traffic reached
    top: int  # the engine's max_num_seqs: the schedule covers 1..top
    tail: tuple[int, ...]  # k at batch reach+1 .. top (dense): the oracle's, kept
    max_k: int
    # Per batch 1..reach (index batch - 1), per k: the oracle's speedup lost against its best k there, 0 within
    # its tolerance: what breaks ties first (scoring's tie rule).
    regret: tuple[tuple[float, ...], ...]

    def entries(self, ks: KTable) -> list[list[int]]:
        """vLLM's num_speculative_tokens_per_batch_size ([start, end, k], inclusive) for these k."""
        dense = [0] * (self.top + 1)
        for i, start in enumerate(self.edges):
            end = self.edges[i + 1] - 1 if i + 1 < len(self.edges) else self.reach
            for b in range(start, end + 1):
                dense[b] = ks[i]
        for offset, k in enumerate(self.tail):
            dense[self.reach + 1 + offset] = k
        entries: list[list[int]] = []
        for b in range(1, self.top + 1):
            if entries and entries[-1][2] == dense[b]:
                entries[-1][1] = b
            else:
                entries.append([b, b, dense[b]])
        return entries

    def segments(self, ks: KTable) -> int:
        """The entries of the schedule (1..top): the tie rule's second measure, fewer is simpler."""
        return len(self.entries(ks))

    def tie(self, ks: KTable) -> tuple[float, int, int]:
        """scoring.Scored.tie of this table."""
        return (self.prior(ks), self.segments(ks), self.k_mass(ks))

    def k_mass(self, ks: KTable) -> int:
        """Sum of k over batch sizes 1..reach: what ties are broken by (smaller k)."""
        total = 0
        for i, start in enumerate(self.edges):
            end = self.edges[i + 1] - 1 if i + 1 < len(self.edges) else self.reach
            total += ks[i] * (end - start + 1)
        return total

    def prior(self, ks: KTable) -> float:
        """The oracle's speedup lost over batch sizes 1..reach: where the traffic cannot tell candidates apart
        (a batch size it rarely runs moves no band beyond the margin), the fixed-batch oracle decides."""
        total = 0.0
        for i, start in enumerate(self.edges):
            end = self.edges[i + 1] - 1 if i + 1 < len(self.edges) else self.reach
            total += sum(self.regret[b - 1][ks[i]] for b in range(start, end + 1))
        return total

    def snap(self, schedule: Sequence[Sequence[int]]) -> KTable:
        """A schedule's k at each edge."""
        table = dense_schedule(tuple((e[0], e[1], e[2]) for e in schedule), self.top, self.max_k)
        return tuple(int(table[min(edge, len(table) - 1)]) for edge in self.edges)

    def neighbours(self, ks: KTable) -> list[KTable]:
        out: set[KTable] = set()
        n = len(ks)
        for i in range(n):  # one edge's k set to any other: +/- 1 alone stopped where k +/- 1 was worse and
            for k in range(self.max_k + 1):  # k +/- 2 better (batch 3 of the test ramp: 4 -> 3 worse, 4 -> 2 best)
                if k != ks[i]:
                    out.add((*ks[:i], k, *ks[i + 1 :]))
        for lo, hi in runs_of(ks):  # a whole segment's k
            for step in (-1, 1):
                k = ks[lo] + step
                if 0 <= k <= self.max_k:
                    out.add(ks[:lo] + (k,) * (hi - lo) + ks[hi:])
        for i in range(1, n):  # a boundary moved by one edge either way
            if ks[i] != ks[i - 1]:
                out.add((*ks[:i], ks[i - 1], *ks[i + 1 :]))
                out.add((*ks[: i - 1], ks[i], *ks[i:]))
        out.discard(ks)
        return sorted(out)

    def simpler(self, ks: KTable) -> list[KTable]:
        """Each segment (within the traffic's reach) set to the k of the segment before or after it (after the
        last: the oracle's k just above the reach), where that leaves the schedule fewer segments: one k change
        removed, two where both neighbours have the same k."""
        out: set[KTable] = set()
        runs = runs_of(ks)
        for i, (lo, hi) in enumerate(runs):
            options = []
            if i > 0:
                options.append(ks[lo - 1])
            if i + 1 < len(runs):
                options.append(ks[hi])
            elif self.tail:
                options.append(self.tail[0])
            for k in options:
                table = ks[:lo] + (k,) * (hi - lo) + ks[hi:]
                if self.segments(table) < self.segments(ks):
                    out.add(table)
        return sorted(out)

    def all_tables(self) -> Iterable[KTable]:
        return itertools.product(range(self.max_k + 1), repeat=len(self.edges))

    def policy(self, ks: KTable, method: str, model: str | None) -> DynamicPolicy:
        entries = self.entries(ks)
        return DynamicPolicy.model_validate(
            {"method": method, "model": model, "max_k": max(1, max(e[2] for e in entries)), "schedule": entries}
        )


def key_of(ks: KTable) -> str:
    return ",".join(map(str, ks))


def table_of(key: str) -> KTable:
    return tuple(int(k) for k in key.split(","))
