"""Designs whose k depends on the steps before (SGLang's adaptive steps, TensorRT-LLM's acceptance gate), checked
against their own rule: the rule is replayed on each engine's recorded steps, in order, and every step's executed
k is compared with the k the rule gives there.

The replay reads what the rule itself reads of a step (batch size, prefills, drafts verified and accepted: the
engine step timeline's columns) and calls the same functions the simulated engine calls
(serve_apps/sim/rules/), so a match means the engine ran the rule, and a mismatch names the steps it did not
take. Each unit is replayed from a fresh rule state, as both executors start each unit (a virtual-time unit
gets a new engine; a real-time replica's engine is reset before each unit, engines/base.py begin_unit). Besides the
executed-k share (the same per-band figures as a schedule's check), each design gets the finding an operator
needs: SGLang's slots and their hysteresis lag (steps and seconds from the load first reaching a slot to the
slot's first switch), whether its slots switched at all; the gate's shutting and whether it stayed shut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from orchestrator.analysis.opmap.results import Finding
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import Requests
from orchestrator.analysis.verify.findings import k_set
from serve_apps.resolved import GateRule, SglangRule

_STEPS = """
SELECT shape, repeat, engine_id, start_ns, batch_size, coalesce(num_prefill, 0) AS num_prefill, k,
       coalesce(drafted, 0) AS drafted, coalesce(accepted, 0) AS accepted
FROM steps WHERE arm = ? AND NOT drafts_skipped
ORDER BY shape, repeat, engine_id, start_ns
"""


@dataclass
class Replayed:
    """One arm's steps against its rule: histograms over (batch size, k) of the executed and the rule's k."""

    executed: np.ndarray  # (batch sizes 0..batch_limit, k) steps by executed k
    expected: np.ndarray  # (batch sizes 0..batch_limit, k) steps by the k the rule gives
    matched: np.ndarray  # (batch sizes 0..batch_limit) steps whose executed k is the rule's
    # (steps where the rule gives another k than the topology fallback's static k, of them those that ran it)
    fallback: tuple[int, int] = (0, 0)
    findings: list[Finding] = field(default_factory=list)


@dataclass
class _Unit:
    start_s: np.ndarray
    batch: np.ndarray
    executed: np.ndarray
    expected: np.ndarray
    slots: np.ndarray | None = None  # SGLang: the slot that decided each step
    shut: np.ndarray | None = None  # gate: shut after the step


def _units(requests: Requests, arm: ArmInfo) -> list[_Unit]:
    rows = requests.con.execute(_STEPS, [arm.name]).fetchnumpy()
    keys = list(zip(rows["shape"], rows["repeat"], rows["engine_id"], strict=True))
    cuts = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
    start, batch, prefill, k, drafted, accepted = (
        np.asarray(rows[c]) for c in ("start_ns", "batch_size", "num_prefill", "k", "drafted", "accepted")
    )
    units = []
    for a, b in pairwise(cuts):
        if a == b:
            continue
        bs = np.minimum(batch[a:b].astype(np.int64), arm.max_num_seqs)
        unit = _Unit(start_s=(start[a:b] - start[a]) / 1e9, batch=bs, executed=k[a:b].astype(np.int64), expected=bs)
        # The rule modules are imported here: they compile with numba, which a run without such arms never needs
        if isinstance(arm.rule, SglangRule):
            from serve_apps.sim.rules.sglang_adaptive import replay

            decoding = bs - prefill[a:b].astype(np.int64)
            unit.expected, unit.slots, _ = replay(arm.rule, arm.max_num_seqs, bs, decoding, accepted[a:b])
        elif isinstance(arm.rule, GateRule):
            from serve_apps.sim.rules.trtllm_gate import replay_gate

            table = [int(x) for x in arm.k_table()]
            unit.expected, unit.shut = replay_gate(arm.rule, table, bs, drafted[a:b], accepted[a:b])
        units.append(unit)
    return units


def replayed(requests: Requests, arms: Sequence[ArmInfo], batch_limit: int) -> dict[str, Replayed]:
    """Per arm with a stateful rule and a step timeline, its steps against the rule (the others: absent)."""
    found: dict[str, Replayed] = {}
    for arm in arms:
        if arm.rule is None or arm.name not in requests.step_arms:
            continue
        units = _units(requests, arm)
        batch = np.concatenate([u.batch for u in units]) if units else np.zeros(0, np.int64)
        executed = np.concatenate([u.executed for u in units]) if units else np.zeros(0, np.int64)
        expected = np.concatenate([u.expected for u in units]) if units else np.zeros(0, np.int64)
        width = int(max(executed.max(initial=0), expected.max(initial=0))) + 1
        clipped = np.minimum(batch, batch_limit)
        hist_exec = np.zeros((batch_limit + 1, width), np.int64)
        hist_expect = np.zeros((batch_limit + 1, width), np.int64)
        np.add.at(hist_exec, (clipped, executed), 1)
        np.add.at(hist_expect, (clipped, expected), 1)
        matched = np.bincount(clipped[executed == expected], minlength=batch_limit + 1)
        other = expected != arm.fallback_k
        fallback = (int(other.sum()), int((executed[other] == arm.fallback_k).sum()))
        result = Replayed(executed=hist_exec, expected=hist_expect, matched=matched, fallback=fallback)
        if isinstance(arm.rule, SglangRule):
            result.findings = [_switched(arm, units), _lag(arm, units)]
        elif isinstance(arm.rule, GateRule):
            result.findings = [_gate(arm, arm.rule, units)]
        found[arm.name] = result
    return found


def _switched(arm: ArmInfo, units: Sequence[_Unit]) -> Finding:
    """A frozen step log: the rule, replayed, switches k; the engine never did."""
    executed = {int(k) for u in units for k in np.unique(u.executed)}
    expected = {int(k) for u in units for k in np.unique(u.expected)}
    steps = sum(len(u.batch) for u in units)
    if len(expected) < 2:
        return Finding.not_exercised(
            "slots_switched", arm.name,
            f"{arm.name}: not exercised: SGLang's rule, replayed on these {steps} steps, never switches (k = "
            f"{k_set(sorted(expected))})",
        )  # fmt: skip
    if len(executed) < 2:
        return Finding(
            check="slots_switched", arm=arm.name, passed=False,
            message=(
                f"{arm.name}: SGLang's slots never switched: executed k = {k_set(sorted(executed))} in all {steps} "
                f"steps although its rule, replayed on them, gives k = {k_set(sorted(expected))}"
            ),
        )  # fmt: skip
    return Finding(
        check="slots_switched", arm=arm.name, passed=True,
        message=f"{arm.name}: executed k took {k_set(sorted(executed))}; SGLang's rule, replayed, gives "
        f"{k_set(sorted(expected))}",
    )  # fmt: skip


def _lag(arm: ArmInfo, units: Sequence[_Unit]) -> Finding:
    """SGLang's hysteresis lag, per slot: from the first step the load put in the slot to the slot's first
    switch, in the slot's own batches and in seconds (the median over units); a slot that never switched says so."""
    assert isinstance(arm.rule, SglangRule)
    lags: dict[int, list[tuple[int, float]]] = {}
    entered: dict[int, int] = {}
    for unit in units:
        assert unit.slots is not None
        for slot in np.unique(unit.slots):
            mine = np.flatnonzero(unit.slots == slot)
            entered[int(slot)] = entered.get(int(slot), 0) + 1
            first_k = unit.executed[mine[0]]
            moved = np.flatnonzero(unit.executed[mine] != first_k)
            if len(moved):
                i = int(moved[0])
                lags.setdefault(int(slot), []).append((i, float(unit.start_s[mine[i]] - unit.start_s[mine[0]])))
    parts = []
    for slot in sorted(entered):
        tier = arm.rule.tiers[slot]
        name = f"slot {tier.lower_bound} ({'/'.join(map(str, tier.candidate_steps))})"
        if slot not in lags:
            parts.append(f"{name} never switched in {entered[slot]} unit{'s' * (entered[slot] != 1)}")
            continue
        steps = int(np.median([n for n, _ in lags[slot]]))
        seconds = float(np.median([s for _, s in lags[slot]]))
        parts.append(f"{name} first switched {steps} of its batches ({seconds:.2f} s) after the load reached it")
    warm = f"warm-up {arm.rule.warmup_batches} batches, then every {arm.rule.update_interval}"
    return Finding(
        check="hysteresis_lag", arm=arm.name, passed=True,
        message=f"{arm.name}: SGLang's hysteresis lag ({warm}): " + "; ".join(parts),
    )  # fmt: skip


def _gate(arm: ArmInfo, rule: GateRule, units: Sequence[_Unit]) -> Finding:
    """Once shut, shut for good: a k > 0 after the replayed gate shut is a gate that re-opened."""
    shut_units = reopened = after = 0
    first_shut: list[float] = []
    for unit in units:
        assert unit.shut is not None
        hits = np.flatnonzero(unit.shut)
        if not len(hits):
            continue
        shut_units += 1
        first_shut.append(float(unit.start_s[hits[0]]))
        later = unit.executed[hits[0] + 1 :]
        after += len(later)
        reopened += int((later > 0).sum())
    words = f"rolling acceptance below {rule.threshold:g} over {rule.window} speculating iterations"
    if reopened:
        return Finding(
            check="gate_stayed_shut", arm=arm.name, passed=False,
            message=(
                f"{arm.name}: the gate re-opened: k > 0 in {reopened} of the {after} steps after it shut ({words}); "
                "TensorRT-LLM's gate disables speculation for good"
            ),
        )  # fmt: skip
    if not shut_units:
        return Finding(
            check="gate_stayed_shut", arm=arm.name, passed=True,
            message=f"{arm.name}: the gate never shut in {len(units)} units (no {words})",
        )  # fmt: skip
    return Finding(
        check="gate_stayed_shut", arm=arm.name, passed=True,
        message=(
            f"{arm.name}: the gate shut in {shut_units} of {len(units)} units, a median "
            f"{float(np.median(first_shut)):.2f} s into the unit ({words}), and stayed shut: k = 0 in all "
            f"{after} steps after"
        ),
    )  # fmt: skip
