"""How far each band's decision reaches in `specdrill recommend`: no coarser than the evidence, no further than
the measured load.

- Split: a report band is cut into its finer bands (recommend_evidence.FINE_CUTS) where the evidence there
  separates k: the band's k is slower than the finer band's fastest beyond the margin, its interval excluding a
  tie (a band 1-8 at k = 3 where k = 4 is faster beyond the margin at 1-2). Where no finer band separates k the
  band stays whole; finer bands that do not separate it keep the band's k, from the band's evidence.
- Cut at the measured load: a band's evidence covers the batch sizes the `off` arm's requests ran at there (their
  typical batch). Above the highest, nothing is measured: that part of the band is a band of its own with no
  evidence, which the schedule fills by inheritance like any band without evidence, and says so.
- Place: each band's k in the schedule: its own where measured; a band without evidence inherits the band
  below's (vLLM's rule for gaps), or, below the first measured band, that band's (vLLM needs batch 1 covered).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.analysis.opmap.kchoice import ratio_text
from orchestrator.decide.recommend.band import counted_runs, decide_band
from orchestrator.decide.recommend.recommendation import BandDecision, Basis
from orchestrator.decide.recommend.runs import RunEvidence


def split(runs: Sequence[RunEvidence], decision: BandDecision, max_k: int) -> list[BandDecision]:
    """The band's decision, or its parts where the finer bands' evidence separates k (module docstring)."""
    if decision.status != "schedule" or decision.k is None:
        return [decision]
    fines = [[c for c in r.batches.fine if decision.low <= c.low and c.high <= decision.high] for r in runs]
    if len(fines[0]) < 2 or any([(c.low, c.high) for c in f] != [(c.low, c.high) for c in fines[0]] for f in fines):
        return [decision]
    limit = 1 + fines[0][0].margin
    marks: list[tuple[int, int, BandDecision | None]] = []
    for per_run in zip(*fines, strict=True):
        fine = decide_band(runs, per_run, max_k)
        kept = next((c for c in fine.candidates if c.vllm_k and c.k == decision.k), None)
        slower = kept is not None and kept.vs_best is not None and (kept.vs_best.low or 0.0) > limit
        separated = fine.status == "off" or (fine.status == "schedule" and slower)
        marks.append((per_run[0].low, per_run[0].high, fine if separated else None))
    if not any(fine for *_, fine in marks):
        return [decision]
    parts: list[BandDecision] = []
    kept_last = False  # the last part keeps the band's k: a next finer band that does not separate k joins it
    for low, high, separated_fine in marks:
        if separated_fine is None:
            start = parts.pop().low if kept_last else low
            parts.append(_kept(decision, start, high))
            kept_last = True
            continue
        fine = separated_fine
        kept = next((c for c in fine.candidates if c.vllm_k and c.k == decision.k), None)
        why = (
            f"k={decision.k} ({kept.arm}) {ratio_text(kept.vs_best)} here" if kept is not None and kept.vs_best
            else f"off faster than {decision.arm} here"
        )  # fmt: skip
        parts.append(fine.model_copy(update={
            "extent": "split", "of_band": decision.band,
            "message": f"{fine.message} (split from {decision.band}, whose k={decision.k} is slower here beyond "
            f"the margin: {why})",
        }))  # fmt: skip
        kept_last = False
    return parts


def _kept(decision: BandDecision, low: int, high: int) -> BandDecision:
    """A part of a split band whose finer evidence does not separate k: the band's k and evidence."""
    label = f"{low}-{high}"
    rest = decision.message.split(": ", 1)[1]
    return decision.model_copy(update={
        "band": label, "low": low, "high": high, "extent": "split", "of_band": decision.band,
        "message": f"{label}: {rest} (from the evidence of {decision.band}: the finer bands' evidence here does not "
        "separate k)",
    })  # fmt: skip


def measured_range(runs: Sequence[RunEvidence], index: int, low: int, high: int) -> tuple[int, int] | None:
    """The batch sizes the `off` arm's requests ran at in band `index` of the report (their typical batch), over
    the runs whose evidence counts, within the band's [low, high]; None where none ran there."""
    found = [r.batches.measured[index] for r in counted_runs(runs) if index < len(r.batches.measured)]
    ranges = [m for m in found if m is not None]
    if not ranges:
        return None
    bottom = max(low, math.floor(min(m[0] for m in ranges)))
    top = min(high, max(bottom, math.ceil(max(m[1] for m in ranges))))
    return bottom, top


def within_measured(
    parts: list[BandDecision], measured: tuple[int, int] | None, off_arm: str | None, max_k: int
) -> list[BandDecision]:
    """Each decided part says the batch range its evidence covers; a part above the highest measured batch is a
    band without evidence of its own (beyond_measured), a part straddling it is cut there."""
    if measured is None or all(p.status == "insufficient" for p in parts):
        return parts
    bottom, top = measured
    out: list[BandDecision] = []
    for part in parts:
        if part.status == "insufficient":
            out.append(part)
            continue
        if part.low > top:
            out.append(_beyond(part, part.low, bottom, top, off_arm, max_k))
            continue
        high = min(part.high, top)
        label = f"{part.low}-{high}"
        rest = part.message.split(": ", 1)[1]
        head, sep, tail = rest.partition(" | ")
        said = f"measured at batch {max(bottom, part.low)}-{high}"
        out.append(part.model_copy(update={
            "band": label, "high": high, "measured_low": max(bottom, part.low), "measured_high": high,
            "of_band": part.of_band or (part.band if high < part.high else None),
            "message": f"{label}: {head}, {said}{sep}{tail}",
        }))  # fmt: skip
        if high < part.high:
            out.append(_beyond(part, high + 1, bottom, top, off_arm, max_k))
    return out


def _beyond(part: BandDecision, low: int, bottom: int, top: int, off_arm: str | None, max_k: int) -> BandDecision:
    band = part.of_band or part.band
    label = f"{low}-{part.high}"
    return BandDecision(
        band=label, low=low, high=part.high, requests=0, needed=part.needed, status="insufficient", k=None,
        arm=None, candidates=[], unmeasured_k=list(range(max_k + 1)), more_repeats=None, confidence="none",
        of_band=band, extent="beyond_measured",
        message=f"{label}: not measured: {off_arm or 'the off arm'}'s requests in {band} ran at batch "
        f"{bottom}-{top}, none above (the load did not reach it)",
    )  # fmt: skip


def place(bands: list[BandDecision], wanted: dict[str, int]) -> list[BandDecision]:
    """Each band's k in the schedule (module docstring)."""
    first = next(b for b in bands if b.band in wanted)
    placed: list[BandDecision] = []
    previous = (first.band, wanted[first.band])
    for b in bands:
        if b.band in wanted:
            basis: Basis = "off_faster" if b.status == "off" else "measured"
            previous = (b.band, wanted[b.band])
            placed.append(b.model_copy(update={"schedule_k": wanted[b.band], "basis": basis}))
        else:
            placed.append(
                b.model_copy(update={"schedule_k": previous[1], "basis": "inherited", "inherited_from": previous[0]})
            )
    return placed
