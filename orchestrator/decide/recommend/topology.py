"""`specdrill recommend` for a data-parallel deployment (runs with `data_parallel` arms, or `--topology
data_parallel:N`). vLLM drops num_speculative_tokens_per_batch_size under data parallelism and runs
num_speculative_tokens in every step (the verifier proves it from the trace: schedule_dropped), so there the
answer is one static k: the one fastest at the measured load, from the one-engine evidence per band (each
candidate's per-token latency over the band's fastest, on the same requests) weighted by the requests per band of
the load the deployment saw (the data-parallel `off` arm's, per engine; else the one-engine `off` arm's). The
smallest k within the margin of the fastest is chosen, as per band and as `tune` chooses its static k: within the
margin the evidence does not tell them apart, and the smaller k drafts less and loses less as load grows (the
oracle's best k falls with the batch). Where the recommended schedule is faster
than that k beyond the margin at the same load, the figure is said with the deployment that keeps the schedule:
`replicas:N` (N engines, each applying the schedule to its own batch) instead of `data_parallel:N`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from orchestrator.analysis.opmap.speedup import weighted_log_mean
from orchestrator.decide.recommend.extent import measured_range
from orchestrator.decide.recommend.recommendation import BandDecision, Candidate, DataParallelAnswer
from orchestrator.decide.recommend.runs import RunEvidence
from serve_apps.policies import Topology


def data_parallel_topology(runs: Sequence[RunEvidence], asked: Topology | None) -> Topology | None:
    """The data-parallel topology to answer for: the operator's, else the runs' (the largest), else None."""
    if asked is not None:
        return asked if asked.kind == "data_parallel" else None
    found = [a.topology for r in runs for a in r.campaign.arms() if a.topology.kind == "data_parallel"]
    return max(found, key=lambda t: t.size) if found else None


def _weights(runs: Sequence[RunEvidence], bands: Sequence[BandDecision], size: int) -> tuple[dict[int, float], str]:
    """Per band index, the requests of the load the deployment saw there: a data-parallel `off` arm's of this
    size where a run has one (its batch is per engine), else each band's n (the one-engine `off` arm's)."""
    for run in runs:
        arms = [a for a in run.campaign.arms() if a.policy.kind == "off" and a.topology.kind == "data_parallel"
                and a.topology.size == size]  # fmt: skip
        if arms and run.summary is not None and run.summary.maps:
            cells = {c.band_index: c.requests for c in run.summary.maps[0].cells if c.arm == arms[0].name}
            return {i: float(cells.get(i, 0)) for i in range(len(bands))}, f"{arms[0].name}'s requests per band"
    return {i: float(b.requests) for i, b in enumerate(bands)}, "the one-engine off arm's requests per band"


def _latency(candidate: Candidate) -> float | None:
    if candidate.vs_best is None:
        return 1.0
    return candidate.vs_best.point


def _dropped(runs: Sequence[RunEvidence]) -> list[str]:
    """The data-parallel arms the verifier showed running static k instead of their schedule."""
    found = []
    for run in runs:
        if run.summary is None:
            continue
        for arm in run.summary.verification.arms:
            if any(f.failed and f.check in ("schedule_dropped", "static_fallback") for f in arm.findings):
                spec = next((a for a in run.campaign.arms() if a.name == arm.arm), None)
                k = getattr(spec.policy, "max_k", None) if spec is not None else None
                found.append(f"{arm.arm} ran static k = {k}" if k is not None else arm.arm)
    return sorted(set(found))


def answer(
    runs: Sequence[RunEvidence], bands: Sequence[BandDecision], topology: Topology, margin: float,
    method: str, model: str | None, schedule_k: dict[int, int | None],
) -> DataParallelAnswer:  # fmt: skip
    """`bands`: the report bands' decisions (one per band, before splits); `schedule_k`: per band index, the
    k the recommended schedule runs there (None: no schedule)."""
    label = f"data_parallel:{topology.size}"
    weights, weighted_by = _weights(runs, bands, topology.size)
    used = [i for i, b in enumerate(bands) if b.status != "insufficient" and weights.get(i, 0) > 0]
    total = sum(weights[i] for i in used)
    names: dict[str, tuple[int, str]] = {}
    logs: dict[str, float] = {}
    for i in used:
        for c in bands[i].candidates:
            if c.design is not None or (c.speculative and c.k == 0):
                continue  # another engine's design, or a drafter loaded that does not draft: never a static choice
            names.setdefault(c.name, (c.k, c.arm))
    for name in list(names):
        per_band = [
            (weights[i], next((_latency(c) for c in bands[i].candidates if c.name == name), None)) for i in used
        ]
        if any(v is None or not v > 0 for _, v in per_band):
            names.pop(name)  # not measured in every band the load reached: not comparable
            continue
        logs[name] = weighted_log_mean((w, v) for w, v in per_band if v is not None)
    header = (
        f"on {label}: vLLM drops num_speculative_tokens_per_batch_size under data parallelism and runs "
        "num_speculative_tokens in every step, so a schedule would be dropped"
    )
    dropped = _dropped(runs)
    if dropped:
        header += f" (the verifier: {'; '.join(dropped)}, not its schedule)"
    if not logs:
        return DataParallelAnswer(
            topology=label, status="insufficient", k=None, arm=None, scores={}, weighted_by=weighted_by,
            schedule_gain=None, speculative_config=None,
            message=f"{header}; no static k was measured in every band its load reached: no static k to recommend",
        )  # fmt: skip
    fastest = min(logs.values())
    scores = {name: math.exp(value - fastest) for name, value in sorted(logs.items(), key=lambda kv: names[kv[0]][0])}
    chosen = min((n for n, v in scores.items() if v <= 1 + margin), key=lambda n: names[n][0])
    k, arm = names[chosen]
    ranges = [r for i in used if (r := measured_range(runs, i, bands[i].low, bands[i].high)) is not None]
    top = max((r[1] for r in ranges), default=max(bands[i].high for i in used))
    reach = f"batch {min(bands[i].low for i in used)}-{top} of the one-engine `off` arm's frame"
    said = ", ".join(f"{n} ({names[n][1]}) {v:.3f}x" for n, v in scores.items())
    k_said = "off" if k == 0 else f"k={k}"
    first = min(scores, key=lambda n: (scores[n], names[n][0]))
    if first == chosen:
        lines = [header + ".", f"the fastest static k at the measured load ({reach}, weighted by {weighted_by}): "
                 f"{k_said} | per-token latency over the fastest: {said}"]  # fmt: skip
    else:  # within the margin the smaller k wins, as tune's static answer (tune_static.smallest_within)
        fastest_said = "off" if names[first][0] == 0 else f"k={names[first][0]}"
        lines = [header + ".", f"the smallest static k within the {margin:.0%} margin of the fastest at the measured "
                 f"load ({reach}, weighted by {weighted_by}): {k_said}, not {fastest_said} (the fastest; {k_said} "
                 f"{scores[chosen]:.3f}x: within the margin the smaller k wins, as in tune: it drafts less and loses "
                 f"less as load grows) | per-token latency over the fastest: {said}"]  # fmt: skip
    gain = None
    if all(schedule_k.get(i) is not None for i in used):
        per_band = []
        for i in used:
            run_k = schedule_k[i]
            found = next((c for c in bands[i].candidates if c.vllm_k and c.k == run_k), None)
            if found is None or _latency(found) is None:
                per_band = []
                break
            per_band.append((weights[i], _latency(found)))
        if per_band:
            schedule_log = sum(w * math.log(v) for w, v in per_band if v) / total
            gain = math.exp(logs[chosen] - schedule_log)
            if gain > 1 + margin:
                lines.append(
                    f"the recommended schedule is {gain:.3f}x faster per token than static k={k} at this load: to "
                    f"keep it, deploy replicas:{topology.size} (engines that each apply the schedule to their own "
                    f"batch) instead of {label}"
                )
            else:
                lines.append(
                    f"the recommended schedule gains {gain:.3f}x over static k={k} at this load, within the "
                    f"{margin:.0%} margin: {label} with static k={k} loses nothing measured"
                )
    config: dict[str, Any] | None = None
    if k > 0:
        config = {"method": method, "num_speculative_tokens": k, **({"model": model} if model else {})}
    return DataParallelAnswer(
        topology=label, status="static" if k > 0 else "off", k=k, arm=arm, scores=scores, weighted_by=weighted_by,
        schedule_gain=gain, speculative_config=config, message="\n".join(lines),
    )  # fmt: skip
