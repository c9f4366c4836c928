"""One batch band's decision in `specdrill recommend` (recommend.py builds the schedule from them).

Per band, the choice is the smallest k within the margin of the fastest speculative arm. `off` (no drafter) is
a candidate apart from a schedule's k = 0 (a drafter loaded that does not draft): the band says "off" only where
`off` is measured faster than every speculative arm beyond the margin. A band whose evidence is too thin (the
map's minimum of requests) says so with its n and what more is needed.

Runs of the same traffic combine: per band and k the candidate with the most requests; candidates of different
runs are compared through each run's `off` arm (their per-token speedups over it, with the conservative interval
of the two intervals' ends), candidates of one run pair by pair.

Another engine's design (SGLang's adaptive steps, TensorRT-LLM's schedule, cap or gate) is a candidate per arm,
named by its design: it may be the band's fastest, and the others are compared with it, but the choice is a k of
vLLM's schedule. Where a design is faster than every vLLM k beyond the margin, the band keeps vLLM's fastest k
and says which design beat it, and by how much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.analysis.opmap.kchoice import BandChoice, KCandidate, ratio_text
from orchestrator.analysis.opmap.results import RatioCI, Verdict
from orchestrator.analysis.opmap.speedup import verdict_for
from orchestrator.decide.recommend.campaigns import MAX_REPEATS
from orchestrator.decide.recommend.recommendation import BandDecision, Candidate, Confidence, Status
from orchestrator.decide.recommend.runs import RunEvidence


def _pooled(
    runs: Sequence[RunEvidence], choices: Sequence[BandChoice]
) -> tuple[dict[int, tuple[str, KCandidate]], dict[str, tuple[str, KCandidate]], tuple[str, KCandidate] | None]:
    """Per k, the speculative candidate with the most requests over the runs (the first run's on a tie); per
    design arm, the same; `off`."""
    speculative: dict[int, tuple[str, KCandidate]] = {}
    designs: dict[str, tuple[str, KCandidate]] = {}
    off: tuple[str, KCandidate] | None = None
    for run, choice in zip(runs, choices, strict=True):
        for c in choice.candidates:
            if not c.speculative:
                if off is None or c.requests > off[1].requests:
                    off = (run.run_dir, c)
            elif c.design is not None:
                if c.arm not in designs or c.requests > designs[c.arm][1].requests:
                    designs[c.arm] = (run.run_dir, c)
            elif c.k not in speculative or c.requests > speculative[c.k][1].requests:
                speculative[c.k] = (run.run_dir, c)
    return speculative, designs, off


def _point(ratio: RatioCI | None) -> float:
    return float(ratio.point) if ratio is not None and ratio.point is not None else float("-inf")


def _slower_by(c: Candidate) -> float:
    """How much slower than the band's fastest (its vs_best point); unknown: last."""
    return float(c.vs_best.point) if c.vs_best is not None and c.vs_best.point is not None else math.inf


def _through_off(best: KCandidate, other: KCandidate, margin: float) -> RatioCI:
    """other's per-token latency over best's from their speedups over their own runs' `off` (the same traffic):
    speedup(best) / speedup(other), the interval from the intervals' far ends."""
    one = RatioCI(point=1.0, low=1.0, high=1.0, verdict=Verdict.NO_DIFFERENCE)
    sb, so = best.speedup, (other.speedup if other.speculative else one)
    if sb is None or so is None or sb.point is None or not so.point:
        return RatioCI(point=None, low=None, high=None, verdict=Verdict.INSUFFICIENT_DATA)
    point = sb.point / so.point
    if sb.low is None or sb.high is None or not so.low or not so.high:
        return RatioCI(point=point, low=None, high=None, verdict=Verdict.INSUFFICIENT_DATA)
    low, high = sb.low / so.high, sb.high / so.low
    return RatioCI(point=point, low=low, high=high, verdict=verdict_for(low, high, margin))


def decide_band(runs: Sequence[RunEvidence], choices: Sequence[BandChoice], max_k: int) -> BandDecision:
    """One band's decision from its evidence in each run (`choices`, one per run, the same band)."""
    first = choices[0]
    counted = {id(r) for r in counted_runs(runs)}
    evidence = [c for r, c in zip(runs, choices, strict=True) if id(r) in counted]
    n = max(e.requests for e in evidence)
    margin, needed = first.margin, first.min_requests
    speculative, designs, off = _pooled(runs, choices)
    unmeasured = [k for k in range(max_k + 1) if k not in speculative]
    if not speculative:
        return _insufficient(runs, choices, n, needed, off, unmeasured)
    best_run, best = max(
        [*speculative.values(), *designs.values()],
        key=lambda rc: (_point(rc[1].speedup), rc[1].design is None, -rc[1].k),
    )
    run_best = {r.run_dir: c.best_arm for r, c in zip(runs, choices, strict=True)}

    def compared(run: str, c: KCandidate) -> Candidate:
        direct = run == best_run and run_best[run] == best.arm
        ratio = None if c is best else c.vs_best if direct else _through_off(best, c, margin)
        return Candidate(
            run=run, arm=c.arm, k=c.k, speculative=c.speculative, requests=c.requests, vs_best=ratio,
            through_off=c is not best and not direct, design=c.design,
        )  # fmt: skip

    candidates = (
        ([compared(*off)] if off else []) + [compared(*speculative[k]) for k in sorted(speculative)]
        + [compared(*designs[arm]) for arm in sorted(designs)]
    )  # fmt: skip
    spec = [c for c in candidates if c.vllm_k]
    limit = 1 + margin
    acceptable = [c for c in spec if c.vs_best is None or (c.vs_best.point is not None and c.vs_best.point <= limit)]
    # A design faster than every vLLM k beyond the margin: the band keeps vLLM's fastest k and says so below.
    beaten_by = (
        next((c for c in candidates if c.design is not None and c.vs_best is None), None) if not acceptable else None
    )
    choice = min(acceptable, key=lambda c: c.k) if acceptable else min(spec, key=_slower_by)
    smaller = [c for c in spec if c.k < choice.k]
    clearly_worse = all(c.vs_best is not None and c.vs_best.low is not None and c.vs_best.low > limit for c in smaller)
    within = choice.vs_best is None or (choice.vs_best.high is not None and choice.vs_best.high <= limit)
    off_candidate = candidates[0] if off else None
    # A schedule's k = 0 is no faster than `off` (the same steps, a drafter loaded besides): where `off` is
    # clearly slower than the choice, an unmeasured k = 0 could not have been chosen.
    off_slower = (
        off_candidate is not None
        and off_candidate.vs_best is not None
        and (off_candidate.vs_best.low is not None and off_candidate.vs_best.low > limit)
    )
    open_k = [k for k in unmeasured if k < max_k and not (k == 0 and off_slower)]
    confidence: Confidence = (
        "high" if clearly_worse and within and not open_k else "medium" if clearly_worse or within else "low"
    )  # fmt: skip
    off_faster = (
        off_candidate is not None and off_candidate.vs_best is not None and off_candidate.vs_best.high is not None
        and off_candidate.vs_best.high < 1 / limit
    )  # fmt: skip
    said = "; ".join(_candidate_text(c) for c in candidates)
    gaps = f"; k = {', '.join(map(str, unmeasured))} not measured" if unmeasured else ""
    if off_faster and off_candidate is not None:
        message = f"{first.band}: off ({off_candidate.arm}) faster than every speculative arm | {said}{gaps}"
        status: Status = "off"
        arm = off_candidate.arm
    else:
        beaten = (
            f"; {beaten_by.arm} ({beaten_by.design}) is faster than every vLLM k here: k={choice.k} is "
            f"{ratio_text(choice.vs_best)} slower" if beaten_by is not None and choice.vs_best is not None else ""
        )  # fmt: skip
        confidence = "low" if beaten else confidence
        message = f"{first.band}: k={choice.k} ({choice.arm}), {confidence} confidence{beaten} | {said}{gaps}"
        status, arm = "schedule", choice.arm
    return BandDecision(
        band=first.band, low=first.low, high=first.high, requests=n, needed=needed, status=status, k=choice.k,
        arm=arm, candidates=candidates, unmeasured_k=unmeasured, more_repeats=None, confidence=confidence,
        message=message,
    )  # fmt: skip


def _candidate_text(c: Candidate) -> str:
    ratio = "fastest" if c.vs_best is None else ratio_text(c.vs_best) + (" via off" if c.through_off else "")
    return f"{c.arm} ({c.name}) {ratio} n={c.requests}"


def _insufficient(
    runs: Sequence[RunEvidence], choices: Sequence[BandChoice], n: int, needed: int,
    off: tuple[str, KCandidate] | None, unmeasured: list[int],
) -> BandDecision:  # fmt: skip
    """Too few data here: n, and what would give the band its needed requests by the map's own rule."""
    counted = {id(r) for r in counted_runs(runs)}
    run, choice = max(
        ((r, c) for r, c in zip(runs, choices, strict=True) if id(r) in counted), key=lambda rc: rc[1].requests
    )
    repeats: int | None = None
    baseline = off[1].arm if off else run.baseline or "off"
    if n == 0 and not any(c.requests for c in run.choices):
        why = (
            f"no request of {baseline} has a batch size in any band: no engine-step telemetry (a server that "
            "reports no steps), so nothing is decided by batch size"
        )
    elif n == 0:
        why = f"no request ran at this batch size on {baseline}: no shape's load reaches it"
    elif n < needed:
        # A quarter more than the count scales to: a band's requests per repeat vary, and a follow-up that
        # falls one short asks again.
        repeats = math.ceil(1.25 * needed * run.repeats / n)
        more = (needed - n) * choice.clock_s / n
        why = (
            f"n={n} of the {needed} a verdict needs ({needed - n} more: repeats {repeats} instead of "
            f"{run.repeats}, or ~{more:.0f} s more at this load)"
        )  # fmt: skip
        repeats = repeats if repeats <= MAX_REPEATS else None
    elif not _on_one_engine(run, baseline):
        why = (
            f"n={n} on {baseline}, which runs more than one engine: a vLLM schedule is per engine (and vLLM drops "
            "schedules under data parallelism), so only arms on one engine with an `off` arm there are candidates"
        )
    else:
        why = f"n={n} on {baseline}, but no speculative arm ran one k throughout here with {needed}+ requests"
    return BandDecision(
        band=choice.band, low=choice.low, high=choice.high, requests=n, needed=needed, status="insufficient", k=None,
        arm=None, candidates=[], unmeasured_k=unmeasured, more_repeats=repeats, confidence="none",
        message=f"{choice.band}: insufficient data: {why}",
    )  # fmt: skip


def counted_runs(runs: Sequence[RunEvidence]) -> list[RunEvidence]:
    """The runs whose band counts are evidence: those whose baseline runs one engine (only their arms are
    candidates), else all (to say what they lack)."""
    return [r for r in runs if r.baseline and _on_one_engine(r, r.baseline)] or list(runs)


def _on_one_engine(run: RunEvidence, arm: str) -> bool:
    topology = next((a.topology for a in run.campaign.arms() if a.name == arm), None)
    return topology is None or topology.kind == "single"
