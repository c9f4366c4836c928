"""The two questions a changed set-up raises, kept apart: did speculation's benefit change (each speculative arm's
ratio over its `off` arm, candidate against baseline), and did the engine itself get slower (the `off` arm
against itself). A host or engine that slows every step moves every arm's cells alike; it shows in the second
answer and cancels in the first, so the release gate on the first (`--fail-on worse`) does not fail on it.

The benefit's change in a band is the arm's own change between the runs over its `off` arm's (compare's two
cells, orchestrator/compare/cells.py): (arm_c / arm_b) / (off_c / off_b) is the candidate's vs-off
ratio over the baseline's. The two cells are different units (the arm's requests and off's ran on their own
engines or at their own times), so their noise is independent and the interval adds their variances on the
log scale, each read back from its cell's interval (a normal interval: the cells' t intervals of a few
stretches make it wider, not narrower)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import median
from typing import Literal

from scipy.stats import norm

from orchestrator.analysis.opmap.kchoice import ratio_text
from orchestrator.analysis.opmap.results import OperatingMap, RatioCI, Verdict
from orchestrator.analysis.opmap.speedup import verdict_for
from orchestrator.compare.model import BenefitChange, CellChange, ChangeVerdict, EngineChange, EngineVerdict

_CHANGE: dict[Verdict, ChangeVerdict] = {
    Verdict.HELPS: "better", Verdict.HURTS: "worse", Verdict.NO_DIFFERENCE: "no_change",
}  # fmt: skip
_SAID = {
    "better": "benefit grew", "worse": "benefit fell", "no_change": "benefit unchanged (within the margin)",
    "not_comparable": "not comparable",
}  # fmt: skip


def n_cells(n: int) -> str:
    return "1 cell" if n == 1 else f"{n} cells"


def every(n: int) -> str:
    """'the one cell', 'both cells', 'all 5 cells'."""
    return {1: "the one cell", 2: "both cells"}.get(n, f"all {n} cells")


def holds_one(ratio: RatioCI) -> bool:
    """Noise can explain a ratio whose interval holds 1, or that has no interval."""
    return ratio.low is None or ratio.high is None or ratio.low <= 1.0 <= ratio.high


def _log_se(ratio: RatioCI, z: float) -> float | None:
    if ratio.point is None or ratio.low is None or ratio.high is None or ratio.low <= 0 or ratio.point <= 0:
        return None
    return (math.log(ratio.high) - math.log(ratio.low)) / (2 * z)


def ratio_of(arm: RatioCI, off: RatioCI, confidence: float, margin: float) -> RatioCI:
    """arm / off, two independent ratios, with the interval their log variances add up to."""
    z = float(norm.ppf(0.5 + confidence / 2))
    se_arm, se_off = _log_se(arm, z), _log_se(off, z)
    if arm.point is None or off.point is None or off.point <= 0:
        return RatioCI(point=None, low=None, high=None, verdict=Verdict.INSUFFICIENT_DATA)
    point = arm.point / off.point
    if se_arm is None or se_off is None:
        return RatioCI(point=point, low=None, high=None, verdict=Verdict.INSUFFICIENT_DATA)
    half = z * math.hypot(se_arm, se_off)
    low, high = point * math.exp(-half), point * math.exp(half)
    return RatioCI(point=point, low=low, high=high, verdict=verdict_for(low, high, margin))


def _vs_off(operating_map: OperatingMap, band: str, arm: str, goodput: bool) -> RatioCI | None:
    try:
        cell = operating_map.cell(band, arm)
    except KeyError:  # the arm has no cell in that band
        return None
    if cell.speedup is None:
        return None
    return cell.speedup.goodput if goodput else cell.speedup.tpot


def _where(cell: CellChange) -> str:
    return f"batch {cell.band}" if cell.measure == "batch_size" else f"{cell.band} req/s"


def _text(ratio: RatioCI | None) -> str:
    return "n/a" if ratio is None else ratio_text(ratio, 2)


def benefit_changes(
    cells: Sequence[CellChange], maps: tuple[Sequence[OperatingMap], Sequence[OperatingMap]], *, confidence: float,
    margin: float,
) -> list[BenefitChange]:  # fmt: skip
    """Per band and speculative arm whose `off` arm was compared too: the change of its ratio over `off`. The
    ratio is the one that decided the baseline run's verdict (goodput where goodput did, else per-token)."""
    base_maps, cand_maps = ({m.measure: m for m in side} for side in maps)
    index = {(c.measure, c.band_index, c.arm): c for c in cells}
    found: list[BenefitChange] = []
    for cell in cells:
        base_map, cand_map = base_maps[cell.measure], cand_maps[cell.measure]
        if base_map.is_baseline(cell.arm):
            continue
        off_name = base_map.baselines.get(cell.arm, base_map.baseline)
        off = index.get((cell.measure, cell.band_index, off_name))
        if off is None:
            continue
        goodput = cell.baseline.decided_by == "goodput"
        what: Literal["per-token", "goodput"] = "goodput" if goodput else "per-token"
        thin = "not_comparable" in (cell.verdict, off.verdict)
        change = ratio_of(cell.goodput if goodput else cell.tpot, off.goodput if goodput else off.tpot, confidence,
                          margin)  # fmt: skip
        verdict: ChangeVerdict = "not_comparable" if thin else _CHANGE.get(change.verdict, "not_comparable")
        before, after = _vs_off(base_map, cell.band, cell.arm, goodput), _vs_off(cand_map, cell.band, cell.arm, goodput)
        noise = holds_one(change) or verdict == "not_comparable"
        said = f"{_SAID[verdict]}: {what} {_text(change)}" if verdict != "not_comparable" else _SAID[verdict]
        found.append(BenefitChange(
            measure=cell.measure, band=cell.band, band_index=cell.band_index, arm=cell.arm, off=off_name, ratio=what,
            baseline=before, candidate=after, change=change, verdict=verdict, noise_explains=noise,
            message=f"{cell.arm} at {_where(cell)}: {what} speedup over {off_name} {_text(before)} in the baseline, "
                    f"{_text(after)} in the candidate: {said}{', noise can explain it' if noise else ''}",
        ))  # fmt: skip
    return found


def engine_changes(cells: Sequence[CellChange], baselines: Sequence[str]) -> list[EngineChange]:
    """Per `off` arm compared: how its own cells moved (both band sets), the engine's change with speculation
    aside."""
    found: list[EngineChange] = []
    for arm in baselines:
        verdict: EngineVerdict
        judged = [c for c in cells if c.arm == arm and c.verdict != "not_comparable"]
        points = [c.tpot.point for c in judged if c.tpot.point is not None]
        slower, faster = sum(c.verdict == "worse" for c in judged), sum(c.verdict == "better" for c in judged)
        figure = "" if not points else (
            f"per-token speed {median(points):.2f}x the baseline's (median; {min(points):.2f}x to "
            f"{max(points):.2f}x across {n_cells(len(points))})"
        )  # fmt: skip
        if not judged:
            verdict, said = "not_comparable", f"{arm} has no comparable cell"
        elif slower and faster:
            verdict, said = "mixed", f"{arm} is slower in {slower} and faster in {faster} of {len(judged)} cells"
        elif slower:
            verdict, said = "slower", f"the engine got slower: {arm} is slower beyond the margin in {slower} of " \
                                      f"{len(judged)} cells"  # fmt: skip
        elif faster:
            verdict, said = "faster", f"the engine got faster: {arm} is faster beyond the margin in {faster} of " \
                                      f"{len(judged)} cells"  # fmt: skip
        else:
            verdict, said = "unchanged", f"the engine is unchanged: {arm} is within the margin in " \
                                         f"{every(len(judged))}"  # fmt: skip
        found.append(EngineChange(
            arm=arm, cells=len(judged), slower=slower, faster=faster, median=median(points) if points else None,
            low=min(points, default=None), high=max(points, default=None), verdict=verdict,
            message=said + (f", {figure}" if figure else ""),
        ))  # fmt: skip
    return found
