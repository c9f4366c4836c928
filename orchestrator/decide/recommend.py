"""`specdrill recommend RUN [RUN ...]`: the report's evidence (summary.json's k_choices: per batch band, every k
some arm executed there compared on the same requests) -> a vLLM schedule where the evidence supports one, a
campaign that rehearses it, and a follow-up campaign for what is missing (recommend_campaigns.py).

Per band, the choice is the smallest k within the margin of the fastest speculative arm. `off` (no drafter) is
a candidate apart from a schedule's k = 0 (a drafter loaded that does not draft): the band says "off" only where
`off` is measured faster than every speculative arm beyond the margin. A band whose evidence is too thin (the
map's minimum of requests) says so with its n and what more is needed; if no band has evidence there is no
recommendation (EXIT_INSUFFICIENT). vLLM needs every batch size from 1 covered, so a band without evidence
inside a recommended schedule inherits a neighbour's k (the band below's, vLLM's own rule for gaps; below the
first measured band, that band's), and the output names each one.

Runs of the same traffic (runs.check_same_traffic) combine: per band and k the candidate with the most
requests; candidates of different runs are compared through each run's `off` arm (their per-token speedups over
it, with the conservative interval of the two intervals' ends), candidates of one run pair by pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import yaml

from orchestrator.analysis.kchoice import KCandidate, ratio_text
from orchestrator.analysis.results import RatioCI, Verdict
from orchestrator.analysis.speedup import verdict_for
from orchestrator.analysis.summary import Summary
from orchestrator.campaign import Campaign
from orchestrator.decide.recommend_campaigns import MAX_REPEATS, followup_campaign, rehearsal_campaign
from orchestrator.decide.recommendation import BandDecision, Basis, Candidate, Confidence, Recommendation, Status
from orchestrator.decide.runs import RunEvidence, check_same_traffic
from serve_apps.policies import DynamicPolicy, FixedPolicy, validate_schedule

EXIT_INSUFFICIENT = 4  # no band has the evidence for a choice: nothing is recommended


def _pooled(
    runs: Sequence[RunEvidence], index: int
) -> tuple[dict[int, tuple[str, KCandidate]], tuple[str, KCandidate] | None]:
    """Per k, the speculative candidate with the most requests over the runs (the first run's on a tie); `off`."""
    speculative: dict[int, tuple[str, KCandidate]] = {}
    off: tuple[str, KCandidate] | None = None
    for run in runs:
        for c in run.choices[index].candidates:
            if not c.speculative:
                if off is None or c.requests > off[1].requests:
                    off = (run.run_dir, c)
            elif c.k not in speculative or c.requests > speculative[c.k][1].requests:
                speculative[c.k] = (run.run_dir, c)
    return speculative, off


def _point(ratio: RatioCI | None) -> float:
    return float(ratio.point) if ratio is not None and ratio.point is not None else float("-inf")


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


def decide_band(runs: Sequence[RunEvidence], index: int, max_k: int) -> BandDecision:
    first = runs[0].choices[index]
    evidence = [r.choices[index] for r in _counted(runs)]
    n = max(e.requests for e in evidence)
    margin, needed = first.margin, first.min_requests
    speculative, off = _pooled(runs, index)
    unmeasured = [k for k in range(max_k + 1) if k not in speculative]
    if not speculative:
        return _insufficient(runs, index, n, needed, off, unmeasured)
    best_run, best = max(speculative.values(), key=lambda rc: (_point(rc[1].speedup), -rc[1].k))
    run_best = {r.run_dir: r.choices[index].best_arm for r in runs}

    def compared(run: str, c: KCandidate) -> Candidate:
        direct = run == best_run and run_best[run] == best.arm
        ratio = None if c is best else c.vs_best if direct else _through_off(best, c, margin)
        return Candidate(
            run=run, arm=c.arm, k=c.k, speculative=c.speculative, requests=c.requests, vs_best=ratio,
            through_off=c is not best and not direct,
        )  # fmt: skip

    candidates = ([compared(*off)] if off else []) + [compared(*speculative[k]) for k in sorted(speculative)]
    spec = [c for c in candidates if c.speculative]
    limit = 1 + margin
    acceptable = [c for c in spec if c.vs_best is None or (c.vs_best.point is not None and c.vs_best.point <= limit)]
    choice = min(acceptable, key=lambda c: c.k)
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
        message = f"{first.band}: k={choice.k} ({choice.arm}), {confidence} confidence | {said}{gaps}"
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
    runs: Sequence[RunEvidence], index: int, n: int, needed: int, off: tuple[str, KCandidate] | None,
    unmeasured: list[int],
) -> BandDecision:  # fmt: skip
    """Too few data here: n, and what would give the band its needed requests by the map's own rule."""
    counted = _counted(runs)
    choice = max((r.choices[index] for r in counted), key=lambda c: c.requests)
    run = next(r for r in counted if r.choices[index] is choice)
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


def _counted(runs: Sequence[RunEvidence]) -> list[RunEvidence]:
    """The runs whose band counts are evidence: those whose baseline runs one engine (only their arms are
    candidates), else all (to say what they lack)."""
    return [r for r in runs if r.baseline and _on_one_engine(r, r.baseline)] or list(runs)


def _on_one_engine(run: RunEvidence, arm: str) -> bool:
    topology = next((a.topology for a in run.campaign.arms() if a.name == arm), None)
    return topology is None or topology.kind == "single"


def _drafter(runs: Sequence[RunEvidence]) -> tuple[str, str | None]:
    drafters = [a.policy for r in runs for a in r.campaign.arms() if isinstance(a.policy, FixedPolicy | DynamicPolicy)]
    return (drafters[0].method, drafters[0].model) if drafters else ("ngram", None)


def build(runs: Sequence[RunEvidence]) -> Recommendation:
    check_same_traffic(list(runs))
    max_k = max(r.max_k for r in runs)
    bands = [decide_band(runs, i, max_k) for i in range(len(runs[0].choices))]
    method, model = _drafter(runs)
    off_arm = next((c.arm for b in bands for c in b.candidates if not c.speculative), runs[0].baseline)
    frame = (
        f"the edges are {off_arm}'s batch sizes (the `off` arm's batch frame): at the same load a speculative "
        "engine runs a smaller batch, so it switches k later than measured"
    )
    common: dict[str, Any] = dict(runs=[r.run_dir for r in runs], mode=runs[0].mode, off_arm=off_arm, method=method,
                                  model=model, frame=frame)  # fmt: skip
    not_measured = [b.band for b in bands if b.status == "insufficient" or b.unmeasured_k]
    decided = [b for b in bands if b.status != "insufficient"]
    thin = [b.message for b in bands if b.status == "insufficient"]
    if max_k == 0:  # `off` alone: more of its requests decide nothing, so no follow-up either
        return Recommendation(
            **common, status="insufficient", num_speculative_tokens=0, schedule=[], bands=bands,
            not_measured=not_measured, speculative_config=None,
            message=f"no recommendation: {' and '.join(r.run_dir for r in runs)} ran no arm with speculation, "
            f"only {off_arm}: nothing to compare it with (add fixed-k or dynamic arms beside it)",
        )  # fmt: skip
    if not decided:
        needed = bands[0].needed if bands else 0
        return Recommendation(
            **common, status="insufficient", num_speculative_tokens=0, schedule=[], bands=bands,
            not_measured=not_measured, speculative_config=None,
            message=f"insufficient data, no recommendation: no band has {needed}+ requests of {off_arm} and of a "
            "speculative arm running one k\n" + "\n".join(b.message for b in bands),
        )  # fmt: skip
    wanted = {b.band: (0 if b.status == "off" else b.k or 0) for b in decided}
    if max(wanted.values()) == 0:
        faster = [b for b in decided if b.status == "off"]
        said = (
            f"{off_arm} is faster than every speculative arm in every measured band" if len(faster) == len(decided)
            else f"no k > 0 is faster than k = 0 beyond the {_margin(runs):.0%} margin in any "
            f"measured band ({off_arm} faster in {len(faster)} of {len(decided)})"
        )  # fmt: skip
        only = f"\nthat holds for the measured bands only: {len(thin)} without evidence (above)" if thin else ""
        return Recommendation(
            **common, status="off", num_speculative_tokens=0, schedule=[], bands=bands, not_measured=not_measured,
            speculative_config=None,
            message=f"leave speculation off: {said}\n" + "\n".join(b.message for b in bands) + only,
        )  # fmt: skip
    placed = _place(bands, wanted)
    schedule: list[list[int]] = []
    for b in placed:
        assert b.schedule_k is not None
        if schedule and schedule[-1][2] == b.schedule_k:
            schedule[-1][1] = b.high
        else:
            schedule.append([1 if not schedule else b.low, b.high, b.schedule_k])
    validate_schedule([tuple(e) for e in schedule])
    top = max(e[2] for e in schedule)
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": top,
                              "num_speculative_tokens_per_batch_size": schedule}  # fmt: skip
    if model:
        config["model"] = model
    lines = [b.message for b in placed]
    inherited = [f"{b.band} k={b.schedule_k} (from {b.inherited_from})" for b in placed if b.basis == "inherited"]
    zeros = [b.band for b in placed if b.basis == "off_faster"]
    if inherited:
        lines.append("no evidence, inherited in the schedule: " + ", ".join(inherited))
    if zeros:
        lines.append(f"{off_arm} faster, the schedule runs k=0 (drafter loaded, k=0 not measured): {', '.join(zeros)}")
    return Recommendation(
        **common, status="schedule", num_speculative_tokens=top, schedule=schedule, bands=placed,
        not_measured=not_measured, speculative_config=config,
        message=f"per batch band, the smallest k within {_margin(runs):.0%} of the fastest speculative arm on the same "
        "requests:\n" + "\n".join(lines),
    )  # fmt: skip


def _margin(runs: Sequence[RunEvidence]) -> float:
    return runs[0].choices[0].margin if runs[0].choices else 0.0


def _place(bands: list[BandDecision], wanted: dict[str, int]) -> list[BandDecision]:
    """Each band's k in the schedule: its own where measured; a band without evidence inherits the band below's
    (vLLM's rule for gaps), or, below the first measured band, that band's (vLLM needs batch 1 covered)."""
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


def recommend_runs(
    runs: Sequence[RunEvidence],
) -> tuple[Recommendation, dict[str, Any] | None, dict[str, Any] | None]:
    """The recommendation, its rehearsal campaign, and a follow-up campaign for what is missing."""
    recommendation = build(runs)
    return recommendation, rehearsal_campaign(runs, recommendation), followup_campaign(runs, recommendation)


def recommend(
    summary: Summary, campaign: Campaign, run_dir: str
) -> tuple[Recommendation, dict[str, Any] | None, dict[str, Any] | None]:
    """One run's recommendation (recommend_runs of that run alone)."""
    return recommend_runs([RunEvidence.of(summary, campaign, run_dir)])


def vllm_snippet(recommendation: Recommendation) -> str:
    if recommendation.speculative_config is None:
        return "# no speculative_config: plain decoding\n" if recommendation.status == "off" else ""
    return yaml.safe_dump({"speculative_config": recommendation.speculative_config}, sort_keys=False)
