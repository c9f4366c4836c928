"""The answer first: per load band, which arm is best and by how much, where plain decoding is preferable, where
the data are too few, each arm's crossover, and the executed-policy findings that change what ran.

Arms on the same hardware (one `off` baseline, equal engines) are compared pairwise on the same requests: bands
are the baseline twin's, so a band holds the same requests in every such arm (`ArmComparison`, computed where
the maps' `scored` view lives: kchoice.paired_both). This module is pure: it reads the maps, those comparisons
and the verification, and says only what a verdict supports. An arm beats another where their paired verdict
is helps; a band's best arm is the one arm no other beats; arms that nothing separates tie.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.analysis.opmap.kchoice import PairedRatios
from orchestrator.analysis.opmap.results import MapCell, Measure, OperatingMap, RatioCI, Verdict, VerificationReport
from orchestrator.analysis.opmap.speedup import combined_verdict, verdict_for
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.verify.findings import CHANGES_WHAT_RAN as CHANGES_WHAT_RAN  # compare's import of it
from orchestrator.analysis.verify.findings import ran_instead

BandStatus = Literal["best", "plain_decoding", "tie", "no_difference", "insufficient_data"]
_FLIPPED = {Verdict.HELPS: Verdict.HURTS, Verdict.HURTS: Verdict.HELPS}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArmComparison(_Model):
    """`arm` against `other` on the same requests of one band; every ratio > 1 favours `arm`."""

    measure: Literal["batch_size", "offered_rate"]
    band: str
    band_index: int
    arm: str
    other: str
    pairs: int
    tpot: RatioCI  # other's per-token latency / arm's (geometric means, pair by pair)
    goodput: RatioCI  # arm's goodput / other's
    verdict: Verdict  # helps: arm beats other; hurts: other beats arm
    decided_by: Measure

    def deciding(self) -> RatioCI:
        return self.goodput if self.decided_by == "goodput" else self.tpot

    def seen_from(self, arm: str) -> ArmComparison:
        """The same comparison with `arm` first (its ratios inverted, its verdict turned)."""
        if arm == self.arm:
            return self
        return self.model_copy(
            update={
                "arm": self.other, "other": self.arm, "tpot": _inverse(self.tpot), "goodput": _inverse(self.goodput),
                "verdict": _FLIPPED.get(self.verdict, self.verdict),
            }
        )  # fmt: skip


class BandAnswer(_Model):
    measure: Literal["batch_size", "offered_rate"]
    band: str
    band_index: int
    hardware: str  # the topology the compared arms share
    status: BandStatus
    best: list[str]  # the best arm, or the arms that tie for best; empty where the data are too few
    requests: int  # the fewest requests any compared arm has in the band
    message: str
    # Of the arms in `best`, those that did not run as configured, with what ran instead: the verdict is on that
    ran_instead: dict[str, str] = Field(default_factory=dict)


class Answer(_Model):
    bands: list[BandAnswer]
    crossovers: list[str]
    executed: list[str]  # findings that change what ran (vLLM's data-parallel fallback)
    ran_instead: dict[str, str] = Field(default_factory=dict)  # arm -> what ran instead of its policy
    comparisons: list[ArmComparison]
    lines: list[str]  # the block as the console prints it


def _inverse(ratio: RatioCI) -> RatioCI:
    def inv(value: float | None) -> float | None:
        return None if value is None or value == 0 else 1.0 / value

    low, high = inv(ratio.high), inv(ratio.low)
    verdict = _FLIPPED.get(ratio.verdict, ratio.verdict)
    return RatioCI(point=inv(ratio.point), low=low, high=high, verdict=verdict)


def comparison_of(
    operating_map: OperatingMap, band_index: int, arm: str, other: str, ratios: PairedRatios
) -> ArmComparison:
    """From kchoice.paired_both's (band, reference=arm, other) ratios: its per-token ratio already favours `arm`,
    its goodput ratio favours `other` and is turned."""
    goodput = _inverse(ratios.goodput)
    margin = operating_map.settings.margin
    if goodput.low is not None and goodput.high is not None:
        goodput = goodput.model_copy(update={"verdict": verdict_for(goodput.low, goodput.high, margin)})
    verdict, decided_by = combined_verdict(ratios.tpot.verdict, goodput.verdict)
    return ArmComparison(
        measure=operating_map.measure, band=operating_map.bands[band_index].label, band_index=band_index, arm=arm,
        other=other, pairs=ratios.pairs, tpot=ratios.tpot, goodput=goodput, verdict=verdict, decided_by=decided_by,
    )  # fmt: skip


def hardware_groups(operating_map: OperatingMap, arms: Sequence[ArmInfo]) -> dict[str, list[str]]:
    """Per baseline arm, the arms on its hardware (itself first): those compared with it at equal engines."""
    info = {a.name: a for a in arms}
    groups: dict[str, list[str]] = {}
    for name in operating_map.arms:
        base = name if info[name].baseline else operating_map.baselines.get(name)
        if base is None:  # its `off` arm has no data here (a run stopped before its units): see _unpaired_lines
            continue
        if name == base or info[name].engines_ratio == 1:
            groups.setdefault(base, [])
            if name == base:
                groups[base].insert(0, name)
            else:
                groups[base].append(name)
    return groups


def _enough(cell: MapCell | None, operating_map: OperatingMap) -> bool:
    return cell is not None and cell.requests >= operating_map.settings.min_requests


def _cells(operating_map: OperatingMap) -> dict[tuple[int, str], MapCell]:
    return {(c.band_index, c.arm): c for c in operating_map.cells}


def comparisons_wanted(operating_map: OperatingMap, arms: Sequence[ArmInfo]) -> list[tuple[int, str, str]]:
    """(band, arm, other) for every pair of arms on the same hardware with enough requests each in the band."""
    cells = _cells(operating_map)
    wanted: list[tuple[int, str, str]] = []
    for members in hardware_groups(operating_map, arms).values():
        for b in range(len(operating_map.bands)):
            judged = [m for m in members if _enough(cells.get((b, m)), operating_map)]
            wanted += [(b, a, o) for i, a in enumerate(judged) for o in judged[i + 1 :]]
    return wanted


def ratio_text(ratio: RatioCI, what: str) -> str:
    if ratio.point is None:
        return f"{what} n/a"
    if ratio.low is None or ratio.high is None:
        return f"{what} {ratio.point:.2f}x (no interval)"
    return f"{what} {ratio.point:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]"


def separated(ratio: RatioCI) -> bool:
    """The interval excludes 1: a difference is shown, though not beyond the margin where the verdict is
    no difference (its near end inside the margin)."""
    return ratio.low is not None and ratio.high is not None and (ratio.low > 1 or ratio.high < 1)


def _unresolved(c: ArmComparison, margin: float) -> str:
    """A no-difference verdict in words that do not claim equality where the interval excludes 1."""
    ratio = c.deciding()
    if not separated(ratio) or ratio.low is None or ratio.high is None:
        return ", no difference"
    faster, low, high = (c.arm, ratio.low, ratio.high) if ratio.low > 1 else (c.other, 1 / ratio.high, 1 / ratio.low)
    ahead = f"{_percent(low - 1)}-{_percent(high - 1)}%"
    return f", {faster} ahead by {ahead}: not shown beyond the {100 * margin:g}% margin"


def _percent(fraction: float) -> str:
    """A gain in percent, one decimal below 10% (0.1-0.4%, 1.0-11%): never a 0-0% for an interval that excludes 1."""
    return f"{100 * fraction:.1f}" if fraction < 0.1 else f"{100 * fraction:.0f}"


def _versus(c: ArmComparison, margin: float = 0.0) -> str:
    what = "goodput" if c.decided_by == "goodput" else "per-token"
    said = {Verdict.HELPS: "", Verdict.NO_DIFFERENCE: _unresolved(c, margin), Verdict.INSUFFICIENT_DATA: ", no verdict"}
    return f"vs {c.other} {ratio_text(c.deciding(), what)}{said.get(c.verdict, ', worse')} (n={c.pairs})"


def _band_label(operating_map: OperatingMap, band: str) -> str:
    return f"batch {band}" if operating_map.measure == "batch_size" else f"{band} req/s"


def _more_data(n: int, needed: int, repeats: int) -> str:
    if n == 0:
        return "no requests here: the campaign's shapes never ran this hardware in this band"
    factor = math.ceil(needed / n)
    more = f"about {factor}x as many requests (repeats: {repeats * factor})"
    return f"n = {n} per arm, {needed} needed for a verdict: {more}"


def _band_answer(
    operating_map: OperatingMap,
    b: int,
    baseline: str,
    members: list[str],
    by_pair: Mapping[frozenset[str], ArmComparison],
    hardware: str,
    repeats: int,
    instead: Mapping[str, str],
) -> BandAnswer:
    cells = _cells(operating_map)
    margin = operating_map.settings.margin

    def versus(c: ArmComparison) -> str:
        return _versus(c, margin)

    def named(arm: str) -> str:
        """An arm crowned or tied for best carries what it ran where that is not its policy."""
        return f"{arm} (not as configured: {instead[arm]})" if arm in instead else arm

    present = [m for m in members if (b, m) in cells and cells[(b, m)].requests > 0]
    band = operating_map.bands[b].label
    where = f"{_band_label(operating_map, band)} ({hardware})"
    judged = [m for m in present if _enough(cells[(b, m)], operating_map)]
    fewest = min((cells[(b, m)].requests for m in present), default=0)
    needed = operating_map.settings.min_requests

    def answer(status: BandStatus, best: list[str], message: str) -> BandAnswer:
        return BandAnswer(
            measure=operating_map.measure, band=band, band_index=b, hardware=hardware, status=status, best=best,
            requests=fewest, message=f"{where}: {message}", ran_instead={a: instead[a] for a in best if a in instead},
        )  # fmt: skip

    if len(judged) < 2:
        return answer("insufficient_data", [], f"insufficient data: {_more_data(fewest, needed, repeats)}")
    pairs = {m: [by_pair[frozenset((m, o))].seen_from(m) for o in judged if o != m and frozenset((m, o)) in by_pair]
             for m in judged}  # fmt: skip
    beaten = {c.other for found in pairs.values() for c in found if c.verdict is Verdict.HELPS}
    undefeated = [m for m in judged if m not in beaten]
    few = [m for m in present if m not in judged]
    tail = "".join(f"; {m}: n = {cells[(b, m)].requests}, too few for a verdict" for m in few)
    plain = [
        c for c in pairs.get(baseline, []) if c.verdict is Verdict.HELPS and baseline in judged
    ]  # plain decoding beats these arms
    if len(undefeated) == 1:
        best = undefeated[0]
        status: BandStatus = "plain_decoding" if best == baseline else "best"
        said = "plain decoding is best" if best == baseline else f"{named(best)} is best"
        return answer(status, [best], f"{said}: " + "; ".join(map(versus, pairs[best])) + tail)
    among = [by_pair[frozenset((a, o))].seen_from(a) for i, a in enumerate(undefeated) for o in undefeated[i + 1 :]
             if frozenset((a, o)) in by_pair]  # fmt: skip
    # "Tie" and "no difference" claim equality: only where no interval between the leaders excludes 1
    apart = any(separated(c.deciding()) for c in among)
    if len(undefeated) == len(judged):
        ties = "; ".join(f"{c.arm} " + versus(c) for c in among)
        said = "no arm is shown better than another beyond the margin" if apart else "no arm is better than another"
        return answer("no_difference", judged, f"{said}: {ties}" + tail)
    tied = ", ".join(map(named, undefeated))
    lead = pairs[undefeated[0]]
    verb = "lead, not separated beyond the margin" if apart else "tie for best"
    message = f"{tied} {verb} ({'; '.join(f'{c.arm} {versus(c)}' for c in among)})"
    beat = [c for c in lead if c.other not in undefeated]
    if beat:
        message += f"; {undefeated[0]} " + "; ".join(map(versus, beat))
    if baseline in undefeated:
        message += "; speculation gains nothing over plain decoding here"
    elif plain:
        message += "; plain decoding beats " + ", ".join(c.other for c in plain)
    return answer("tie", undefeated, message + tail)


def _without_baseline(operating_map: OperatingMap, info: Mapping[str, ArmInfo]) -> list[str]:
    """Arms whose `off` arm has no data in this run (its units did not complete): nothing to compare them with."""
    return [
        f"{name}: its `off` arm ({info[name].compared_with or 'none'}) has no data in this run: nothing to compare "
        "it with"
        for name in operating_map.arms
        if not info[name].baseline and name not in operating_map.baselines
    ]


def _empty_bands(operating_map: OperatingMap, members: Sequence[str]) -> list[int]:
    """The bands where no arm of this hardware has a request: the traffic never put it there."""
    cells = _cells(operating_map)
    return [
        b for b in range(len(operating_map.bands))
        if all(cells.get((b, m)) is None or cells[(b, m)].requests == 0 for m in members)
    ]  # fmt: skip


def _unfilled(operating_map: OperatingMap) -> str:
    """Why a band has no request: the campaign's shapes never ran there (what they offered is what was measured;
    the band is not a load that was tried and missed)."""
    if operating_map.measure == "offered_rate":
        return "no shape offers these rates: nothing measured there"
    return "the campaign's shapes never ran this hardware at these batch sizes: nothing measured there"


def _nothing_banded(operating_map: OperatingMap, members: Sequence[str]) -> str:
    unbanded = sum(operating_map.unbanded.get(m, 0) for m in members)
    if operating_map.measure == "batch_size" and unbanded:
        return (
            f"no request has a batch size ({unbanded} requests, no engine steps: the server reports none), so "
            "nothing is decided by batch size"
        )
    if unbanded:
        return f"no request has an offered rate ({unbanded} requests: closed-loop or replayed traffic)"
    return "no requests"


def _slo_warning(maps: Sequence[OperatingMap]) -> list[str]:
    """An SLO no request met: goodput is 0 everywhere, so no goodput ratio exists and every verdict is per-token
    latency's alone. Said once, beside the verdicts it qualifies."""
    cells = [c for m in maps for c in m.cells if c.completed > 0]
    if not cells or any((c.goodput_fraction or 0) > 0 for c in cells):
        return []
    return [
        "warning: no completed request met the SLOs: goodput is 0 in every band, so every verdict above rests on "
        "per-token latency alone (check the campaign's slo)"
    ]


def _crossover_lines(operating_map: OperatingMap, instead: Mapping[str, str]) -> list[str]:
    cells = _cells(operating_map)
    lines = []
    for crossover in operating_map.crossovers:
        line = f"crossover by {operating_map.measure.replace('_', ' ')}: {crossover.message}"
        cell = cells.get((crossover.band_index, crossover.arm)) if crossover.band_index is not None else None
        if cell is not None and cell.speedup is not None:
            s = cell.speedup
            what = "goodput" if s.decided_by == "goodput" else "per-token"
            line += f" ({ratio_text(s.deciding, what)} vs {s.baseline}, n = {cell.requests})"
        if crossover.arm in instead:
            line += f"; {crossover.arm} did not run as configured: {instead[crossover.arm]}"
        lines.append(line)
    return lines


def answer_of(
    maps: Sequence[OperatingMap],
    comparisons: Sequence[ArmComparison],
    verification: VerificationReport,
    arms: Sequence[ArmInfo],
    *,
    repeats: int = 1,
) -> Answer:
    info = {a.name: a for a in arms}
    instead = {a.arm: said for a in verification.arms if (said := ran_instead(a)) is not None}
    bands: list[BandAnswer] = []
    lines = ["answer (arms on the same hardware compared on the same requests; ratios > 1 favour the arm first)"]
    for operating_map in maps:
        lines.append(f"by {operating_map.measure.replace('_', ' ')} ({operating_map.unit}):")
        mine = [c for c in comparisons if c.measure == operating_map.measure]
        groups = sorted(hardware_groups(operating_map, arms).items(), key=lambda g: info[g[0]].data_parallel_size)
        for baseline, members in groups:
            hardware = info[baseline].topology
            if len(members) == 1:  # an `off` arm alone on its hardware: no band has anything to decide
                lines.append(f"  {hardware}: nothing to compare with: {baseline} is the only arm on this hardware")
                continue
            empty = _empty_bands(operating_map, members)
            if len(empty) == len(operating_map.bands):
                lines.append(f"  {hardware}: {_nothing_banded(operating_map, members)}")
                continue
            for b in range(len(operating_map.bands)):
                by_pair = {frozenset((c.arm, c.other)): c for c in mine if c.band_index == b}
                found = _band_answer(operating_map, b, baseline, members, by_pair, hardware, repeats, instead)
                bands.append(found)
                if b not in empty:
                    lines.append(f"  {found.message}")
            if empty:
                labels = ", ".join(_band_label(operating_map, operating_map.bands[b].label) for b in empty)
                lines.append(f"  {labels} ({hardware}): {_unfilled(operating_map)}")
        lines.extend(f"  {line}" for line in _without_baseline(operating_map, info))
        for name in operating_map.arms:
            base = operating_map.baselines.get(name)
            if info[name].engines_ratio != 1 and base is not None:
                lines.append(
                    f"  {name} ({info[name].topology}) has no `off` on its topology: compared only per engine with "
                    f"{base} (add `off` on {info[name].topology} to compare it on the same hardware)"
                )
        lines.extend(f"  {line}" for line in _crossover_lines(operating_map, instead))
    lines.extend(f"  {line}" for line in _slo_warning(maps))
    executed = [
        f"{f.message}: its cells measure what ran, not its policy"
        for checked in verification.arms
        for f in checked.findings
        if f.failed and f.check in CHANGES_WHAT_RAN
    ]
    if executed:
        lines.append("what ran:")
        lines.extend(f"  {line}" for line in executed)
    return Answer(
        bands=bands, crossovers=[x for m in maps for x in _crossover_lines(m, instead)], executed=executed,
        ran_instead=instead, comparisons=list(comparisons), lines=lines,
    )  # fmt: skip
