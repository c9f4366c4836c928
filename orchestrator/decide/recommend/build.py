"""`specdrill recommend RUN [RUN ...]`: the report's evidence (summary.json's k_choices: per batch band, every k
some arm executed there compared on the same requests) -> a vLLM schedule where the evidence supports one, a
campaign that rehearses it, and a follow-up campaign for what is missing (recommend_campaigns.py).

Per band the decision is recommend_band.py's (the smallest k within the margin of the fastest speculative arm,
`off` only where measured faster than every speculative arm, "insufficient data" with n where the evidence is
thin); if no band has evidence there is no recommendation (EXIT_INSUFFICIENT). A band is no coarser than its
evidence and reaches no further than the measured load (recommend_extent.py): split where finer bands separate
k, cut at the highest batch the `off` arm's requests ran at. vLLM needs every batch size from 1 covered, so a
band without evidence (above the measured load too) inherits a neighbour's k in the schedule, and the output
names each one. Runs of the same traffic (runs.check_same_traffic) combine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from orchestrator.analysis.summary import Summary
from orchestrator.decide.recommend.band import decide_band
from orchestrator.decide.recommend.campaigns import followup_campaign, rehearsal_campaign
from orchestrator.decide.recommend.categories import category_checks
from orchestrator.decide.recommend.extent import measured_range, place, split, within_measured
from orchestrator.decide.recommend.recommendation import BandDecision, Recommendation
from orchestrator.decide.recommend.runs import RunEvidence, check_same_traffic
from orchestrator.decide.recommend.topology import answer, data_parallel_topology
from orchestrator.plan.campaign import Campaign
from serve_apps.policies import DynamicPolicy, FixedPolicy, Topology, validate_schedule

EXIT_INSUFFICIENT = 4  # no band has the evidence for a choice: nothing is recommended


def _drafter(runs: Sequence[RunEvidence]) -> tuple[str, str | None]:
    drafters = [a.policy for r in runs for a in r.campaign.arms() if isinstance(a.policy, FixedPolicy | DynamicPolicy)]
    return (drafters[0].method, drafters[0].model) if drafters else ("ngram", None)


def build(runs: Sequence[RunEvidence], topology: Topology | None = None) -> Recommendation:
    """The recommendation for one engine, and for a data-parallel deployment where the runs have data-parallel
    arms or `topology` asks for one (recommend_topology.py)."""
    check_same_traffic(list(runs))
    max_k = max(r.max_k for r in runs)
    coarse = [decide_band(runs, [r.choices[i] for r in runs], max_k) for i in range(len(runs[0].choices))]
    found = _build(runs, coarse, max_k)
    dp = data_parallel_topology(runs, topology)
    if dp is None or max_k == 0:
        return found
    schedule_k = {i: (0 if b.status == "off" else b.k) if found.status == "schedule" else None
                  for i, b in enumerate(coarse)}  # fmt: skip
    said = answer(runs, coarse, dp, _margin(runs), found.method, found.model, schedule_k)
    return found.model_copy(update={"data_parallel": said})


def _build(runs: Sequence[RunEvidence], coarse: list[BandDecision], max_k: int) -> Recommendation:
    off_arm = next((c.arm for b in coarse for c in b.candidates if not c.speculative), runs[0].baseline)
    bands: list[BandDecision] = []
    for i, band in enumerate(coarse):
        measured = measured_range(runs, i, band.low, band.high)
        bands += within_measured(split(runs, band, max_k), measured, off_arm, max_k)
    top = max((b.measured_high for b in bands if b.measured_high is not None), default=None)
    # A band no request reached, above the highest measured batch, is beyond the measured load too
    bands = [
        b.model_copy(update={"extent": "beyond_measured"})
        if top is not None and b.status == "insufficient" and not b.requests and b.low > top else b
        for b in bands
    ]  # fmt: skip
    method, model = _drafter(runs)
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
    placed = place(bands, wanted)
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
    inherited = [f"{b.band} k={b.schedule_k} (from {b.inherited_from})" for b in placed if b.basis == "inherited"
                 and b.extent != "beyond_measured"]  # fmt: skip
    beyond = [f"{b.band} k={b.schedule_k} (from {b.inherited_from})" for b in placed if b.extent == "beyond_measured"]
    zeros = [b.band for b in placed if b.basis == "off_faster"]
    if inherited:
        lines.append("no evidence, inherited in the schedule: " + ", ".join(inherited))
    if beyond:
        lines.append(
            "above the measured load, inherited, not measured (no confidence: the k there may differ): "
            + ", ".join(beyond)
        )
    if zeros:
        lines.append(f"{off_arm} faster, the schedule runs k=0 (drafter loaded, k=0 not measured): {', '.join(zeros)}")
    checks = category_checks(runs, placed)
    lines += checks
    return Recommendation(
        **common, status="schedule", num_speculative_tokens=top, schedule=schedule, bands=placed,
        not_measured=not_measured, speculative_config=config, category_checks=checks,
        message=f"per batch band, the smallest k within {_margin(runs):.0%} of the fastest speculative arm on the same "
        "requests:\n" + "\n".join(lines),
    )  # fmt: skip


def _margin(runs: Sequence[RunEvidence]) -> float:
    return runs[0].choices[0].margin if runs[0].choices else 0.0


def recommend_runs(
    runs: Sequence[RunEvidence], topology: Topology | None = None
) -> tuple[Recommendation, dict[str, Any] | None, dict[str, Any] | None]:
    """The recommendation, its rehearsal campaign, and a follow-up campaign for what is missing."""
    recommendation = build(runs, topology)
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


def data_parallel_snippet(recommendation: Recommendation) -> str:
    """The data-parallel answer's lines and its config (no schedule: vLLM would drop it), or nothing."""
    dp = recommendation.data_parallel
    if dp is None:
        return ""
    config = (
        yaml.safe_dump({"speculative_config": dp.speculative_config}, sort_keys=False) if dp.speculative_config
        else "# no speculative_config: plain decoding\n" if dp.status == "off" else ""
    )  # fmt: skip
    return dp.message + "\n" + (f"for {dp.topology}:\n{config}" if config else "")
