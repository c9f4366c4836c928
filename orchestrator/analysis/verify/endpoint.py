"""Findings only an endpoint arm (a foreign server) needs, in its dialect's terms (serve_apps/engine_kinds/
dialects/): how its steps' batch sizes were estimated, whether the trace's totals reconcile with the server's own
counters over each unit, what its draft-length gauge showed, and which checks its telemetry cannot decide.

The counters are read before and after each unit's traffic (orchestrator/execute/endpoint_scrape.py), so the warm-up and
earlier units fall outside the delta; the trace's sums are over the same unit's rows.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.analysis.opmap.results import ArmVerification, Finding
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import Requests
from serve_apps.engine_kinds.dialects import vllm
from serve_apps.engine_kinds.dialects.base import Dialect

# How a total is named in the reconciliation's line (vLLM's reads "12 drafts, 30 draft tokens, 20 accepted").
_WORDS = {
    "spec_steps": "drafts", "drafted_tokens": "draft tokens", "accepted_tokens": "accepted",
    "output_tokens": "output tokens", "num_drafts": "drafts", "draft_tokens": "draft tokens",
    "generation_tokens": "generated tokens",
}  # fmt: skip
# The checks that stand on each step's executed k: a dialect without it cannot decide them.
STEP_CHECKS = ("executed_k", "static_fallback", "schedule_switched")


def endpoint_findings(
    requests: Requests, arm: ArmInfo, samples: pa.Table, steps_without_batch: int, *, steps_from_drafts: bool,
    dialect: Dialect = vllm.DIALECT,
) -> list[Finding]:  # fmt: skip
    findings = []
    if steps_from_drafts and dialect.steps == "per_step":
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
    findings.append(reconcile(requests, arm.name, samples, dialect))
    gauge = gauge_finding(arm.name, samples, dialect)
    return findings + ([gauge] if gauge else [])


def without_steps(result: ArmVerification, dialect: Dialect) -> ArmVerification:
    """An endpoint arm whose server reports no step's draft length: every check standing on the executed k is not
    verifiable, never a pass (nor a fail from an empty step count), for the dialect's reason."""
    # A server that says nothing per request (TensorRT-LLM) shows no drafts in any row: whether the arm speculated
    # is not the rows' to say either (its counters, in the reconciliation, are).
    blind = STEP_CHECKS + (() if dialect.request.fields else ("identity",))
    findings = [
        Finding.not_verifiable(f.check, result.arm, f"{result.arm}: not verifiable: {dialect.steps_note}")
        if f.check in blind
        else f
        for f in result.findings
    ]
    return result.model_copy(update={"findings": findings, "passed": all(f.passed for f in findings)})


def gauge_finding(arm: str, samples: pa.Table, dialect: Dialect) -> Finding | None:
    """What the server's draft-length gauge read in this arm's samples, and what such samples cannot show."""
    if dialect.draft_length is None or "draft_length" not in samples.column_names:
        return None
    rows = samples.filter(pc.equal(samples.column("arm"), arm))
    values = Counter(int(v) for v in rows.column("draft_length").to_pylist() if v is not None)
    if not values:
        return None
    read = ", ".join(f"{k} in {n}" for k, n in sorted(values.items()))
    return Finding(
        check="telemetry", arm=arm, passed=True,
        message=f"{arm}: the server's draft-length gauge read {read} of {sum(values.values())} samples; "
        f"{dialect.gauge_note}",
    )  # fmt: skip


def reconcile(requests: Requests, arm: str, samples: pa.Table, dialect: Dialect = vllm.DIALECT) -> Finding:
    """Each (trace total, counter) pair the dialect names, per unit: the trace's sum against the counter's delta.
    Counters with no trace total beside them (a server that says nothing per request) are reported as measured."""
    requests.con.register("reconcile_samples", samples)
    keys = list(dict.fromkeys([c for _, c in dialect.reconciles] + list(dialect.counters)))
    # A labelled counter has no series until its first increment (prometheus_client; SGLang's, TensorRT-LLM's):
    # absent from the unit's first sample, it stood at 0 then. Absent from every sample, the server has none.
    deltas = requests.con.execute(
        "SELECT shape, repeat, "
        + ", ".join(f"arg_max({k}, time_ns) - arg_min(coalesce({k}, 0), time_ns)" for k in keys)
        + " FROM reconcile_samples WHERE arm = ? GROUP BY ALL ORDER BY ALL",
        [arm],
    ).fetchall()
    columns = [t for t, _ in dialect.reconciles]
    sums = {
        (str(r[0]), int(r[1])): r[2:]
        for r in requests.con.execute(
            "SELECT shape, repeat"
            + "".join(f", sum(coalesce({c}, 0))" for c in columns)
            + " FROM trace WHERE arm = ? GROUP BY ALL",
            [arm],
        ).fetchall()
    }
    pairs = [i for i, k in enumerate(keys) if k in {c for _, c in dialect.reconciles}]
    if not deltas or all(d[2 + i] is None for d in deltas for i in pairs):
        return Finding.not_verifiable(
            "reconciliation", arm,
            f"{arm}: not verifiable: the server exports none of its counters on {dialect.metrics_path}",
        )  # fmt: skip
    problems, totals = [], dict.fromkeys(keys, 0.0)
    for shape, repeat, *server in deltas:
        traced = sums.get((str(shape), int(repeat)), (0,) * len(columns))
        by_key = dict(zip(keys, server, strict=True))
        for key, value in by_key.items():
            totals[key] += value or 0.0
        for (column, counter), t in zip(dialect.reconciles, traced, strict=True):
            s = by_key[counter]
            if s is None or round(s) != int(t or 0):
                problems.append(f"{shape}/r{repeat} {column} {int(t or 0)} vs {counter} delta {s}")
    if problems:
        return Finding(
            check="reconciliation", arm=arm, passed=False,
            message=f"{arm}: the trace does not reconcile with the server's counters: " + "; ".join(problems),
        )  # fmt: skip
    matched = ", ".join(f"{round(totals[counter])} {_WORDS[column]}" for column, counter in dialect.reconciles)
    alone = [k for k in dialect.counters if k not in {c for _, c in dialect.reconciles}]
    measured = (
        "; measured without a per-request figure to check them against: "
        + ", ".join(f"{round(totals[k])} {_WORDS[k]}" for k in alone)
        if alone
        else ""
    )
    return Finding(
        check="reconciliation", arm=arm, passed=True,
        message=(
            f"{arm}: trace totals equal the server's counter deltas over {len(deltas)} units (warm-up excluded): "
            f"{matched}{measured}"
        ),
    )  # fmt: skip
