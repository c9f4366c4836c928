"""What moved between the runs beyond the cells: each arm's verdict against its `off` arm, its crossover, and
the policy its engine executed (a schedule dropped, a fallback that appeared)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.analysis.answer import CHANGES_WHAT_RAN
from orchestrator.analysis.opmap.kchoice import ratio_text
from orchestrator.analysis.opmap.results import MapCell, OperatingMap, RatioCI, Verdict
from orchestrator.analysis.summary import Summary
from orchestrator.compare.cells import RunPair
from orchestrator.compare.model import CrossoverMove, Direction, PolicyChange, VerdictChange

_SAID = {Verdict.HELPS: "helped", Verdict.HURTS: "hurt", Verdict.NO_DIFFERENCE: "made no difference"}
_NOW = {Verdict.HELPS: "now helps", Verdict.HURTS: "now hurts", Verdict.NO_DIFFERENCE: "now no difference"}
NOISE, BEYOND = "within the intervals, noise can explain it", "beyond both runs' intervals"


def _where(operating_map: OperatingMap, band: str) -> str:
    return f"batch {band}" if operating_map.measure == "batch_size" else f"{band} req/s"


def _cell(operating_map: OperatingMap, band: str, arm: str) -> MapCell | None:
    return next((c for c in operating_map.cells if c.band == band and c.arm == arm), None)


def _judged(cell: MapCell | None) -> bool:
    return cell is not None and cell.speedup is not None and cell.speedup.verdict in _SAID


def _overlap(a: RatioCI, b: RatioCI) -> bool:
    if None in (a.low, a.high, b.low, b.high):
        return True  # no interval: nothing shows the change is more than noise
    assert a.low is not None and a.high is not None and b.low is not None and b.high is not None
    return a.low <= b.high and b.low <= a.high


def verdict_changes(pair: RunPair, arms: Sequence[str]) -> list[VerdictChange]:
    """Cells where both runs reached a verdict against their `off` arm and the verdicts differ. Beyond the
    intervals: the baseline's deciding ratio and the candidate's same ratio have intervals that do not overlap."""
    found: list[VerdictChange] = []
    for base_map, cand_map in zip(pair.baseline_maps, pair.candidate_maps, strict=True):
        for band in base_map.bands:
            for arm in arms:
                before, after = _cell(base_map, band.label, arm), _cell(cand_map, band.label, arm)
                if not (_judged(before) and _judged(after)):
                    continue
                assert before is not None and after is not None and before.speedup and after.speedup
                if before.speedup.verdict is after.speedup.verdict:
                    continue
                measure = before.speedup.decided_by
                same = after.speedup.goodput if measure == "goodput" else after.speedup.tpot
                noise = _overlap(before.speedup.deciding, same)
                what = "goodput" if measure == "goodput" else "per-token"
                said = NOISE if noise else BEYOND
                found.append(VerdictChange(
                    measure=base_map.measure, band=band.label, arm=arm, baseline=before.speedup.verdict.value,
                    candidate=after.speedup.verdict.value, noise_explains=noise,
                    message=f"{arm} {_SAID[before.speedup.verdict]} at {_where(base_map, band.label)} ({what} "
                            f"{ratio_text(before.speedup.deciding, 2)}), {_NOW[after.speedup.verdict]} ({what} "
                            f"{ratio_text(same, 2)}): {said}",
                ))  # fmt: skip
    return found


def _stop(operating_map: OperatingMap, arm: str) -> tuple[int | None, int | None, str | None]:
    """(the highest band with a verdict or None: none, the crossover band's index or None: helps wherever judged,
    its label)."""
    judged = [c.band_index for c in operating_map.cells if c.arm == arm and _judged(c)]
    found = next((x for x in operating_map.crossovers if x.arm == arm), None)
    highest = max(judged) if judged else None
    if found is None or found.band_index is None:
        return highest, None, None
    return highest, found.band_index, found.band


def _noise_explains(base_map: OperatingMap, arm: str, bands: range, changes: Sequence[VerdictChange]) -> bool:
    """A crossover moves because the verdicts in the bands between its two places changed: noise can explain the
    move unless one of those verdict changes is beyond the intervals."""
    labels = {base_map.bands[b].label for b in bands if b < len(base_map.bands)}
    return all(v.noise_explains for v in changes if v.measure == base_map.measure and v.arm == arm
               and v.band in labels)  # fmt: skip


def crossover_moves(pair: RunPair, arms: Sequence[str], changes: Sequence[VerdictChange]) -> list[CrossoverMove]:
    """Where an arm stops helping, in both runs, where the band differs (both bands named). An arm that helps in
    every band with a verdict is known to help only up to its highest such band: a crossover above it in the other
    run is outside the first run's data, said so, not a move. Each move says whether noise can explain it (the
    verdict changes between its two bands, `changes`)."""
    moves: list[CrossoverMove] = []
    for base_map, cand_map in zip(pair.baseline_maps, pair.candidate_maps, strict=True):
        for arm in arms:
            (top_b, b_index, b_band), (top_c, c_index, c_band) = _stop(base_map, arm), _stop(cand_map, arm)
            if top_b is None or top_c is None or b_index == c_index:
                continue
            # helps everywhere judged: it helps at least up to the band above its highest verdict
            before = top_b + 1 if b_index is None else b_index
            after = top_c + 1 if c_index is None else c_index
            outside = (b_index is None and after >= before) or (c_index is None and before >= after)
            direction: Direction = "outside_data" if outside else ("lower" if after < before else "higher")
            was = f"stopped helping at {_where(base_map, b_band)}" if b_band else "helped in every band with a verdict"
            now = f"stops at {_where(cand_map, c_band)}" if c_band else "helps in every band with a verdict"
            said = (
                "a crossover where the other run has no verdict (not a move)"
                if outside
                else f"crossover by {base_map.measure.replace('_', ' ')} moved to a {direction} load"
            )
            noise = _noise_explains(base_map, arm, range(min(before, after), max(before, after)), changes)
            beyond = f"not noise: a verdict change between the two bands is {BEYOND}"
            tail = "" if outside else f": {NOISE if noise else beyond}"
            moves.append(CrossoverMove(
                measure=base_map.measure, arm=arm, baseline_band=b_band, candidate_band=c_band, direction=direction,
                noise_explains=noise or outside,
                message=f"{arm}: {said}: {was} in the baseline, {now} in the candidate{tail}",
            ))  # fmt: skip
    return moves


def _what_ran(summary: Summary) -> dict[str, dict[str, str]]:
    """Per arm: the failed checks that change what ran, with their messages."""
    found: dict[str, dict[str, str]] = {}
    for checked in summary.verification.arms:
        for f in checked.findings:
            if f.failed and f.check in CHANGES_WHAT_RAN:
                found.setdefault(checked.arm, {})[f.check] = f.message
    return found


def policy_changes(
    baseline: Summary, candidate: Summary, baseline_arms: Sequence[str], candidate_arms: Sequence[str]
) -> list[PolicyChange]:
    """Arms that ran in one run only, and executed-policy findings (a schedule dropped, a static fallback) that
    appeared or went away."""
    changes = [PolicyChange(arm=a, message=f"{a} ran in the baseline and is not in the candidate run")
               for a in baseline_arms if a not in candidate_arms]  # fmt: skip
    changes += [PolicyChange(arm=a, message=f"{a} is new in the candidate run")
                for a in candidate_arms if a not in baseline_arms]  # fmt: skip
    before, after = _what_ran(baseline), _what_ran(candidate)
    for arm in [a for a in baseline_arms if a in candidate_arms]:
        was, now = before.get(arm, {}), after.get(arm, {})
        # One change per arm and direction: a dropped schedule fails both checks (the drop, and the static k it fell
        # back to), one event that is said once, with the first finding's words.
        appeared, gone = sorted(set(now) - set(was)), sorted(set(was) - set(now))
        if appeared:
            what = (
                "its schedule ran in the baseline and is dropped in the candidate"
                if "schedule_dropped" in appeared
                else "a fallback appeared in the candidate"
            )
            changes.append(PolicyChange(arm=arm, message=f"{arm}: {what} ({', '.join(appeared)}): {now[appeared[0]]}"))
        if gone:
            said = f"{', '.join(gone)} in the baseline, gone in the candidate (it ran its policy)"
            changes.append(PolicyChange(arm=arm, message=f"{arm}: {said}: {was[gone[0]]}"))
    return changes
