"""The recommended schedule checked per workload category: the schedule is chosen on the whole mix (every band's
k on all its requests, never on the category that accepts best); here each band it speculates in is read per
category (summary.json speedup_by_category: the chosen arm against `off` on the same requests), and a category
the chosen k makes slower than plain decoding beyond the map's margin is named with its band and interval. A
category can be hurt only in the busy bands (a verification step costs more at a large batch); a band holding too
few of a category's requests for a verdict is said to be thin, never advice."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.opmap.category_speedup import MIN_PAIRS
from orchestrator.analysis.opmap.results import Verdict
from orchestrator.decide.recommend.recommendation import BandDecision
from orchestrator.decide.recommend.runs import RunEvidence


def category_checks(runs: Sequence[RunEvidence], bands: Sequence[BandDecision]) -> list[str]:
    """One line per (band, category) the schedule's k hurts beyond the margin; one line saying the check was made
    where none is hurt; nothing where the runs carry a single category."""
    hurt: list[str] = []
    thin: list[str] = []
    checked: set[str] = set()
    for b in bands:
        if b.basis != "measured" or not b.schedule_k or b.arm is None:
            continue
        label = b.of_band or b.band
        for run in runs:
            summary = run.summary
            if summary is None:
                continue
            rows = [r for r in summary.speedup_by_category if r.band == label and r.arm == b.arm]
            checked.update(r.category for r in rows)
            cell = next((c for m in summary.maps[:1] for c in m.cells if c.band == label and c.arm == b.arm), None)
            mix = cell.speedup.verdict if cell is not None and cell.speedup is not None else None
            short = [r for r in rows if r.verdict == Verdict.INSUFFICIENT_DATA]
            thin += [f"not enough requests of {r.category} in band {b.band} ({r.pairs} pairs, {MIN_PAIRS} needed)"
                     for r in short]  # fmt: skip
            for r in rows:
                if r.verdict != Verdict.HURTS or r.low is None or r.high is None:
                    continue
                said = "helps the mix, hurts" if mix == Verdict.HELPS else "hurts"
                hurt.append(
                    f"{b.band} k={b.schedule_k} ({b.arm}): {said} {r.category}: per-token latency "
                    f"{1 / r.speedup:.2f}x off's [{1 / r.high:.2f}x, {1 / r.low:.2f}x] on its {r.pairs} requests"
                )
    if len(checked) < 2:
        return []
    few = [f"  {line}: not checked there" for line in thin]
    if hurt:
        return [f"checked per category ({', '.join(sorted(checked))}): the schedule's k is slower than off beyond "
                "the margin for", *(f"  {line}" for line in hurt), *few]  # fmt: skip
    return [f"checked per category ({', '.join(sorted(checked))}): no category is slower than off beyond the margin "
            "where the schedule speculates", *few]  # fmt: skip
