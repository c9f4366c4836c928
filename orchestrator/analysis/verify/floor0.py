"""TensorRT-LLM's floor-0 fault, seen per request: acceptance after a request's first k = 0 step collapses.

At a schedule's floor 0 the one-model drafter's state is not refreshed (TensorRT-LLM bug #16888, open), so a
request that decoded through a k = 0 step accepts nothing for the rest of its life. The rows' per-request lists
say it: `step_k` (the k of every step the request was in) and `per_step_drafted` / `per_step_accepted` (the steps
that verified drafts, in order). The drafts verified after the first k = 0 step are the last of those lists: one
per later step that proposed k > 0 to the request (each verified in the step after). The check compares their
acceptance with the acceptance of every other verified draft of the arm; a design with a floor 0 gets it.
"""

from __future__ import annotations

from orchestrator.analysis.opmap.results import Finding
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import Requests
from orchestrator.analysis.verify.findings import pct

# Collapsed: the drafts after the first k = 0 step accept less than this share of what the others accept.
COLLAPSE_SHARE = 0.25
MIN_DRAFTS = 30  # drafts after a k = 0 step needed to say either way

_ROWS = """
SELECT step_k, per_step_drafted, per_step_accepted FROM trace
WHERE arm = ? AND len(per_step_drafted) > 0 AND len(step_k) > 0
"""


def floor0_finding(requests: Requests, arm: ArmInfo) -> Finding:
    listed = requests.con.execute("SELECT count(step_k) FROM trace WHERE arm = ?", [arm.name]).fetchone()
    if not listed or not listed[0]:
        return Finding.not_verifiable(
            "floor0_fault", arm.name,
            f"{arm.name}: not verifiable: the floor-0 check reads each request's steps, which this run did not store "
            "(load.store_step_lists: true stores them)",
        )  # fmt: skip
    drafted_after = accepted_after = drafted_before = accepted_before = hit = 0
    for ks, drafted, accepted in requests.con.execute(_ROWS, [arm.name]).fetchall():
        zero = next((j for j in range(1, len(ks)) if ks[j] == 0), None)  # step 0 is the request's prefill
        later = 0 if zero is None else min(sum(1 for k in ks[zero:-1] if k > 0), len(drafted))
        cut = len(drafted) - later
        drafted_before += sum(drafted[:cut])
        accepted_before += sum(accepted[:cut])
        if later:
            hit += 1
            drafted_after += sum(drafted[cut:])
            accepted_after += sum(accepted[cut:])
    if drafted_after < MIN_DRAFTS or not drafted_before:
        return Finding.not_exercised(
            "floor0_fault", arm.name,
            f"{arm.name}: not exercised: {drafted_after} drafts were verified after a request's first k = 0 step "
            f"({MIN_DRAFTS} needed)",
        )  # fmt: skip
    after, before = accepted_after / drafted_after, accepted_before / drafted_before
    said = (
        f"{hit} requests accepted {pct(after)} of their {drafted_after} drafts after their first k = 0 step, "
        f"against {pct(before)} of the arm's other drafts"
    )
    if after < COLLAPSE_SHARE * before:
        return Finding(
            check="floor0_fault", arm=arm.name, passed=False,
            message=(
                f"{arm.name}: acceptance collapsed after k = 0: {said} (TensorRT-LLM's floor-0 fault: the "
                "drafter's state is not refreshed at k = 0, bug #16888)"
            ),
        )  # fmt: skip
    return Finding(check="floor0_fault", arm=arm.name, passed=True, message=f"{arm.name}: no floor-0 collapse: {said}")
