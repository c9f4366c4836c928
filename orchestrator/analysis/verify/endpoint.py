"""Findings only an endpoint arm (a foreign server) needs: how its steps' batch sizes were estimated, and whether
the trace's draft totals reconcile with the server's own spec-decode counters over each unit.

The counters are read before and after each unit's traffic (orchestrator/execute/endpoint_scrape.py), so the warm-up and
earlier units fall outside the delta; the trace's sums are over the same unit's rows.
"""

from __future__ import annotations

import pyarrow as pa

from orchestrator.analysis.opmap.results import Finding
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import Requests

# trace column -> the endpoint sample's counter it must equal (vLLM: num_spec_steps per request sums to the
# drafts counter, drafted tokens to the draft-token counter, accepted to the accepted counter)
_PAIRS = (("spec_steps", "num_drafts"), ("drafted_tokens", "draft_tokens"), ("accepted_tokens", "accepted_tokens"))


def endpoint_findings(
    requests: Requests, arm: ArmInfo, samples: pa.Table, steps_without_batch: int, *, steps_from_drafts: bool
) -> list[Finding]:
    findings = []
    if steps_from_drafts:
        exact = (
            "an upper bound for n-gram (it may propose fewer tokens than k)"
            if (arm.method or "").startswith("ngram")
            else "exact for a draft-model or EAGLE drafter"
        )
        left = f"; {steps_without_batch} steps had no sample before them, left out" if steps_without_batch else ""
        findings.append(
            Finding(
                check="endpoint_approximation", arm=arm.name, passed=True,
                message=(
                    f"{arm.name}: foreign server: executed k from per_step_drafted ({exact}); batch size from "
                    "the server's running-requests gauge on /metrics, sampled during the unit (the latest sample "
                    "before each step, divided over the server's engines; steps placed evenly between first token and "
                    "end), "
                    f"so batch sizes near a schedule boundary are approximate; steps count once per request{left}"
                ),
            )
        )  # fmt: skip
    findings.append(reconcile(requests, arm.name, samples))
    return findings


def reconcile(requests: Requests, arm: str, samples: pa.Table) -> Finding:
    """The trace's drafts, draft tokens and accepted tokens per unit against the server's counter deltas."""
    requests.con.register("reconcile_samples", samples)
    deltas = requests.con.execute(
        """
        SELECT shape, repeat,
               arg_max(num_drafts, time_ns) - arg_min(num_drafts, time_ns),
               arg_max(draft_tokens, time_ns) - arg_min(draft_tokens, time_ns),
               arg_max(accepted_tokens, time_ns) - arg_min(accepted_tokens, time_ns)
        FROM reconcile_samples WHERE arm = ? GROUP BY ALL ORDER BY ALL
        """,
        [arm],
    ).fetchall()
    sums = {
        (str(r[0]), int(r[1])): r[2:]
        for r in requests.con.execute(
            "SELECT shape, repeat, sum(coalesce(spec_steps, 0)), sum(coalesce(drafted_tokens, 0)), "
            "sum(coalesce(accepted_tokens, 0)) FROM trace WHERE arm = ? GROUP BY ALL",
            [arm],
        ).fetchall()
    }
    if not deltas or all(v is None for d in deltas for v in d[2:]):
        return Finding.not_verifiable(
            "reconciliation", arm, f"{arm}: not verifiable: the server exports no spec-decode counters on /metrics"
        )
    problems, totals = [], [0, 0, 0]
    for shape, repeat, *server in deltas:
        traced = sums.get((str(shape), int(repeat)), (0, 0, 0))
        for i, ((column, counter), s, t) in enumerate(zip(_PAIRS, server, traced, strict=True)):
            totals[i] += int(t or 0)
            if s is None or round(s) != int(t or 0):
                problems.append(f"{shape}/r{repeat} {column} {int(t or 0)} vs {counter} delta {s}")
    if problems:
        return Finding(
            check="reconciliation", arm=arm, passed=False,
            message=f"{arm}: the trace does not reconcile with the server's counters: " + "; ".join(problems),
        )  # fmt: skip
    return Finding(
        check="reconciliation", arm=arm, passed=True,
        message=(
            f"{arm}: trace totals equal the server's counter deltas over {len(deltas)} units (warm-up excluded): "
            f"{totals[0]} drafts, {totals[1]} draft tokens, {totals[2]} accepted"
        ),
    )  # fmt: skip
