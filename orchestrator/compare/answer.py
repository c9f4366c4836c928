"""The answer first (one paragraph for a release review) and the release gate (`--fail-on`)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.compare.model import CellChange, Comparison, FailOn, PolicyChange, VerdictChange

FAIL_ON: tuple[FailOn, ...] = ("worse", "verdict-change", "policy-change", "any")


def _where(cell: CellChange) -> str:
    return f"batch {cell.band}" if cell.measure == "batch_size" else f"{cell.band} req/s"


def _ratio(cell: CellChange) -> str:
    ratio = cell.goodput if cell.decided_by == "goodput" else cell.tpot
    what = "goodput" if cell.decided_by == "goodput" else "per-token"
    if ratio.point is None:
        return what
    interval = "" if ratio.low is None or ratio.high is None else f" [{ratio.low:.2f}, {ratio.high:.2f}]"
    return f"{what} {ratio.point:.2f}x{interval}"


def _listed(cells: Sequence[CellChange], limit: int = 6) -> str:
    shown = "; ".join(f"{c.arm} at {_where(c)} ({_ratio(c)})" for c in cells[:limit])
    return shown + (f"; and {len(cells) - limit} more" if len(cells) > limit else "")


def gate_failures(
    fail_on: Sequence[FailOn], cells: Sequence[CellChange], changes: Sequence[VerdictChange],
    policies: Sequence[PolicyChange],
) -> list[str]:  # fmt: skip
    """One line per reason the gate fails. A verdict change counts where it is beyond the two runs' intervals."""
    wanted = set(FAIL_ON[:3]) if "any" in fail_on else set(fail_on)
    lines = []
    if "worse" in wanted:
        lines += [f"worse: {c.message}" for c in cells if c.verdict == "worse"]
    if "verdict-change" in wanted:
        lines += [f"verdict change: {v.message}" for v in changes if v.beyond_intervals]
    if "policy-change" in wanted:
        lines += [f"policy change: {p.message}" for p in policies]
    return lines


def answer_paragraph(c: Comparison) -> str:
    """What moved, most important first, in one paragraph."""
    judged = [x for x in c.cells if x.verdict != "not_comparable"]
    worse = [x for x in judged if x.verdict == "worse"]
    better = [x for x in judged if x.verdict == "better"]
    how = "the same traffic, request by request" if c.paired else "different traffic, unpaired"
    parts = [f"Candidate run {c.candidate_run} against baseline run {c.baseline_run} ({how}; margin {c.margin:g})."]
    if c.setup:
        shown = sorted({d.what for d in c.setup})
        parts.append(f"Set-up differs in {', '.join(shown[:6])}{' and more' if len(shown) > 6 else ''}.")
    else:
        parts.append("The set-up is the same.")
    if worse:
        parts.append(f"Worse in {len(worse)} of {len(judged)} comparable cells: {_listed(worse)}.")
    if better:
        parts.append(f"Better in {len(better)} of {len(judged)}: {_listed(better)}.")
    if not worse and not better:
        parts.append(f"No change in any of the {len(judged)} comparable cells.")
    thin = len(c.cells) - len(judged)
    if thin:
        cells = "1 cell has" if thin == 1 else f"{thin} cells have"
        parts.append(f"{cells} too few requests in one run or both to compare.")
    real = [v for v in c.verdict_changes if v.beyond_intervals]
    if real:
        parts.append("Verdicts against plain decoding changed: " + "; ".join(v.message for v in real) + ".")
    noise = len(c.verdict_changes) - len(real)
    if noise:
        parts.append(f"{noise} verdict change{'s' if noise > 1 else ''} within the intervals (noise can explain it).")
    parts += [m.message + "." for m in c.crossover_moves]
    parts += [p.message + "." for p in c.policy_changes]
    if c.recommended[2:] == ["the recommended schedule changed"]:
        parts.append(f"The recommended schedule changed: {c.recommended[0]}; {c.recommended[1]}.")
    if not c.verdict_changes and not c.crossover_moves and not c.policy_changes:
        parts.append("No verdict, crossover or executed policy changed.")
    if c.fail_on:
        parts.append(f"Gate ({', '.join(c.fail_on)}): " + (f"FAILED ({len(c.gate_failures)} reasons)."
                                                            if c.gate_failures else "passed."))  # fmt: skip
    return " ".join(parts)
