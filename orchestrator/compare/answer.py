"""The answer first (one paragraph for a release review) and the release gate (`--fail-on`).

The answer keeps the operator's two questions apart, speculation's benefit first: is speculation still worth
it (each arm's ratio over `off`, compare/benefit.py), then did the engine itself get slower (`off` against
itself), then every arm's own cells. `--fail-on worse` gates on the first: a host or engine slower on every
step slows `off` as much as the speculative arms, which the answer names with its figure, and which
`--fail-on engine-slower` gates on where that is the question."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from orchestrator.compare.benefit import every
from orchestrator.compare.model import (
    BenefitChange,
    CellChange,
    Comparison,
    EngineChange,
    FailOn,
    PolicyChange,
    VerdictChange,
)

FAIL_ON: tuple[FailOn, ...] = ("worse", "engine-slower", "verdict-change", "policy-change", "any")


def _where(cell: CellChange | BenefitChange) -> str:
    return f"batch {cell.band}" if cell.measure == "batch_size" else f"{cell.band} req/s"


def _ratio(cell: CellChange) -> str:
    ratio = cell.goodput if cell.decided_by == "goodput" else cell.tpot
    what = "goodput" if cell.decided_by == "goodput" else "per-token"
    if ratio.point is None:
        return what
    interval = "" if ratio.low is None or ratio.high is None else f" [{ratio.low:.2f}, {ratio.high:.2f}]"
    return f"{what} {ratio.point:.2f}x{interval}"


def _change(b: BenefitChange) -> str:
    r = b.change
    interval = "" if r.low is None or r.high is None else f" [{r.low:.2f}, {r.high:.2f}]"
    return f"{_where(b)} ({b.ratio} {r.point:.2f}x{interval})" if r.point is not None else _where(b)


def _listed(cells: Sequence[CellChange], limit: int = 6) -> str:
    shown = "; ".join(f"{c.arm} at {_where(c)} ({_ratio(c)})" for c in cells[:limit])
    return shown + (f"; and {len(cells) - limit} more" if len(cells) > limit else "")


def _by_arm(benefits: Sequence[BenefitChange], limit: int = 4) -> list[str]:
    """One line per arm: its bands, the first `limit` with their figures."""
    lines = []
    for arm, group in groupby(sorted(benefits, key=lambda b: b.arm), key=lambda b: b.arm):
        found = list(group)
        shown = ", ".join(_change(b) for b in found[:limit])
        lines.append(f"{arm} at {shown}" + (f" and {len(found) - limit} more" if len(found) > limit else ""))
    return lines


def gate_failures(
    fail_on: Sequence[FailOn], benefits: Sequence[BenefitChange], engines: Sequence[EngineChange],
    changes: Sequence[VerdictChange], policies: Sequence[PolicyChange],
) -> list[str]:  # fmt: skip
    """Why the gate fails, grouped: one line per arm and reason. worse: speculation's benefit fell beyond the
    margin; engine-slower: an `off` arm is slower beyond the margin; verdict-change: a verdict against `off`
    changed beyond the intervals; policy-change: what an engine executed changed."""
    wanted = set(FAIL_ON[:4]) if "any" in fail_on else set(fail_on)
    lines = []
    if "worse" in wanted:
        fell = [b for b in benefits if b.verdict == "worse"]
        lines += [f"worse (speculation's benefit fell): {line}" for line in _by_arm(fell)]
    if "engine-slower" in wanted:
        lines += [f"engine slower: {e.message}" for e in engines if e.slower]
    if "verdict-change" in wanted:
        real = sorted((v for v in changes if not v.noise_explains), key=lambda v: v.arm)
        for _arm, group in groupby(real, key=lambda v: v.arm):
            found = list(group)
            lines.append(f"verdict change ({len(found)}): " + "; ".join(v.message for v in found))
    if "policy-change" in wanted:
        lines += [f"policy change: {p.message}" for p in policies]
    return lines


def _benefit_sentence(benefits: Sequence[BenefitChange]) -> str:
    judged = [b for b in benefits if b.verdict != "not_comparable"]
    if not judged:
        return "Speculation's benefit (each arm's speedup over off): no band comparable in both runs."
    fell = [b for b in judged if b.verdict == "worse"]
    grew = [b for b in judged if b.verdict == "better"]
    head = "Speculation's benefit (each arm's speedup over off, candidate against baseline)"
    if not fell and not grew:
        return f"{head}: unchanged in {every(len(judged))} comparable in both runs (within the margin)."
    said = [f"fell in {len(fell)} of {len(judged)} cells: " + "; ".join(_by_arm(fell))] if fell else []
    said += [f"grew in {len(grew)} of {len(judged)}: " + "; ".join(_by_arm(grew))] if grew else []
    return f"{head}: " + "; ".join(said) + "."


def _traffic_sentences(c: Comparison) -> list[str]:
    if c.paired:
        return [f"Candidate run {c.candidate_run} against baseline run {c.baseline_run} (the same traffic, request "
                f"by request; margin {c.margin:g})."]  # fmt: skip
    what = "; ".join(c.traffic_differences)
    warning = (
        "the gate judges it because --allow-different-traffic says so"
        if c.allow_different_traffic
        else "a gate refuses such runs unless --allow-different-traffic says so"
    )
    return [f"Candidate run {c.candidate_run} against baseline run {c.baseline_run}: DIFFERENT TRAFFIC ({what}): "
            f"cells compared side against side, unpaired, margin {c.margin:g}; {warning}."]  # fmt: skip


def answer_paragraph(c: Comparison) -> str:
    """What moved, most important first, in one paragraph."""
    parts = _traffic_sentences(c)
    parts.append(_benefit_sentence(c.benefit_changes))
    parts += [e.message[0].upper() + e.message[1:] + "." for e in c.engine_changes]
    if c.setup:
        shown = sorted({d.what for d in c.setup})
        parts.append(f"Set-up differs in {', '.join(shown[:6])}{' and more' if len(shown) > 6 else ''}.")
    else:
        parts.append("The set-up is the same.")
    judged = [x for x in c.cells if x.verdict != "not_comparable"]
    worse = [x for x in judged if x.verdict == "worse"]
    better = [x for x in judged if x.verdict == "better"]
    if worse:
        parts.append(f"Every arm's own cells: worse in {len(worse)} of {len(judged)} comparable cells: "
                     f"{_listed(worse, 3)}.")  # fmt: skip
    if better:
        parts.append(f"Better in {len(better)} of {len(judged)}: {_listed(better, 3)}.")
    if not worse and not better:
        parts.append(f"No change in any of the {len(judged)} comparable cells.")
    thin = len(c.cells) - len(judged)
    if thin:
        cells = "1 cell has" if thin == 1 else f"{thin} cells have"
        parts.append(f"{cells} too few requests in one run or both to compare.")
    real = [v for v in c.verdict_changes if not v.noise_explains]
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
