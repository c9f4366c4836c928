"""What `specdrill tune` prints: its answer first (the topology it is for, the speculative_config, each batch
range with the evidence behind it), then the data-parallel alternative, then how it was searched."""

from __future__ import annotations

import json

import yaml

from orchestrator.analysis.steps.prediction_check import Prediction
from orchestrator.decide.scoring import Objective
from orchestrator.decide.tune.build import Choice, TuneResult
from orchestrator.decide.tune.simplify import differences
from orchestrator.decide.tune.topology import StaticAnswer

TIE_RULE = (
    "ties (no band worse beyond the margin, the paired total within one margin) go to the fixed-batch oracle's k "
    "(k within its tolerance of its best count as equal), then to the simpler schedule (fewer k changes; speculation "
    "off is the simplest), then to the smaller k; a k change is removed where the traffic predicts no effect beyond "
    "the margin"
)
STATIC_RULE = (
    "the static k on a data-parallel group: the smallest k within the margin of the best-scoring one (per-token "
    "latency paired per seed, each band's median weighted by its requests; goodput no worse beyond the margin), "
    "recommend's rule"
)
MEASURED = "measured (the simulator's prediction on the campaign's own load)"
INHERITED = "inherited, not measured: the campaign's traffic never ran these batch sizes (confidence: none)"
ORACLE_K = "the simulator's fixed-batch oracle's k, untested by this traffic"
STATIC_K = "the same static k, which vLLM runs at every batch size"


def answered_for(topology: str, why: str) -> str:
    """Which deployment an answer is for, why, and how to ask for another (tune's and tune --design's first line)."""
    return (f"answered for {topology} because {why}; --topology single, replicas:N or data_parallel:N answers for "
            "another deployment")  # fmt: skip


def describe(result: TuneResult, prediction: Prediction, tuned_arm: str, objective: Objective) -> list[str]:
    lines = answer_lines(result)
    if result.stopped_by_budget:
        unimproved = "; it is the oracle's start, unimproved" if result.winner == result.start else ""
        what = "the answer above" if result.static is None else "the schedule set against the static k below"
        lines.append(
            f"stopped by the budget after {result.candidates} candidates (not converged, --budget {result.budget}): "
            f"{what} is the best found so far, not a tuned schedule{unimproved}"
        )
    if result.topology_why:
        lines.append(answered_for(result.topology, result.topology_why))
    lines += band_lines(result, prediction.seeds)
    if result.static is not None:
        lines += static_lines(result, result.static)
    lines.append("predicted per-token speedup vs off per offered-rate band, median [lowest, highest seed]:")
    for band in prediction.predicted:
        parts = [f"{arm} {p.speedup.text()}" for arm, p in band.arms.items() if arm != prediction.tuned_arm]
        tuned = band.arms[tuned_arm].speedup.text()
        lines.append(f"  {band.band} req/s: {tuned_arm} {tuned}; " + "; ".join(parts))
    start = "the fixed-batch oracle's schedule (tune.json: start_schedule, oracle_schedule)"
    where = f" on {result.topology_name}'s engines as replicas" if result.static is not None else ""
    lines += [
        f"searched {result.candidates} candidate schedules{where} in {result.seconds:.1f} s (virtual time, "
        f"{prediction.seeds} seeds each), from {start}",
        f"objective per offered-rate band: SLO goodput first, then {objective.label}; a difference counts beyond "
        f"the margin, over seeds by median -/+ 1.4826 MAD; {TIE_RULE}"
        + (f"; {STATIC_RULE}" if result.static is not None else ""),
    ]
    if result.noisy_bands:
        lines.append(f"not scored (noisy over seeds, relative MAD > 0.1): {', '.join(result.noisy_bands)}")
    if result.static is None:
        lines += tie_lines(result)
    return lines


def answer_lines(result: TuneResult) -> list[str]:
    """The answer: for which topology, and the speculative_config to set."""
    topology = f"{result.topology} ({result.topology_name})"
    found = "best found before the budget stopped the search" if result.stopped_by_budget else "answer"
    if result.static is not None:
        head = f"answer for {topology}: "
        if result.static.k == 0:
            return [head + "speculation off (no static k beat it beyond the margin on the data-parallel group)"]
        lines = [
            head + f"static k = {result.static.k} in every step. Under data parallelism vLLM drops "
            "num_speculative_tokens_per_batch_size and runs num_speculative_tokens in every step, so this is the "
            "static k for the campaign's traffic at this topology (the smallest within the margin of the best), and "
            "the config has no per-batch schedule:"
        ]
    elif result.speculative_config is None:
        return [f"{found} for {topology}: speculation off in every band (no schedule beat it beyond the margin)"]
    else:
        lines = [f"{found} for {topology}, in vLLM's own batch frame (the batch one engine running it reaches):"]
    lines.append(yaml.safe_dump({"speculative_config": result.speculative_config}, sort_keys=False,
                                default_flow_style=None).rstrip())  # fmt: skip
    if result.static is not None and result.static.within:
        lines.append(result.static.within)
    return lines


def band_lines(result: TuneResult, seeds: int) -> list[str]:
    """Each batch range of the answer with what stands behind it: the batch sizes one engine ran under the answer
    itself in the played traffic (off, slower, runs larger batches), and above them nothing but the oracle's k."""
    reach = result.answer_reach or result.reach
    if result.schedule is None:
        return [f"the played traffic ran one engine at batch 1-{reach}: speculation off is predicted for that load only"
                f" (the simulator's prediction; nothing is said of larger batches)"]
    lines = [f"by batch range ({seeds} seeds in virtual time; under the answer the played traffic ran one engine at "
             f"batch 1-{reach}, under off 1-{result.reach}):"]  # fmt: skip
    above = STATIC_K if result.static is not None else ORACLE_K
    for start, end, k in result.schedule:
        span = f"batch {start}-{end}" if end > start else f"batch {start}"
        if end <= reach:
            lines.append(f"  {span}: k = {k}, {MEASURED}")
        elif start > reach:
            lines.append(f"  {span}: k = {k}, {above}; {INHERITED}")
        else:
            lines.append(f"  {span}: k = {k}; batch {start}-{reach} {MEASURED}; batch {reach + 1}-{end}: {above}; "
                         f"{INHERITED}")  # fmt: skip
    return lines


def static_lines(result: TuneResult, static: StaticAnswer) -> list[str]:
    """The data-parallel answer's alternative: the schedule on as many replicas, where it beats the static k."""
    lines = []
    if static.beyond_reach:
        lines.append(static.beyond_reach)
    if not static.figures:
        return lines
    figures = "; ".join(f"{f.band} req/s {f.speedup.text()}" for f in static.figures)
    schedule = json.dumps(result.final.schedule)
    gain = "n/a" if static.schedule_gain is None else f"{static.schedule_gain:.3f}x"
    weighed = f"{gain} faster per token on the traffic (its bands weighted by their requests)"
    if static.schedule_wins:
        faster = static.faster_bands
        where = ("; beyond the margin in " + ", ".join(f"{f.band} req/s ({f.speedup.text()})" for f in faster)
                 if faster else "")  # fmt: skip
        lines.append(
            f"a schedule would beat static k = {static.k} beyond the margin at the measured load: {schedule} is "
            f"{weighed}{where}. {static.topology} cannot run it (vLLM drops it); to keep it, serve "
            f"{static.schedule_topology} instead: {static.topology.split(':')[1]} independent engines behind a "
            f"router, each with num_speculative_tokens_per_batch_size {schedule} (per band, static k's per-token "
            f"latency over the schedule's, median [lowest, highest seed]: {figures})"
        )
    else:
        lines.append(
            f"no schedule beats static k = {static.k} beyond the margin at the measured load: the best tune found "
            f"for {static.schedule_topology} (where vLLM keeps a schedule), {schedule}, is {weighed}, within the "
            f"{static.margin:.0%} margin; per band against static k = {static.k}: {figures} (static k's per-token "
            "latency over the schedule's): data parallelism gives up nothing measurable here"
        )
    return lines


def tie_lines(result: TuneResult) -> list[str]:
    """Why the schedule given is not the best-scoring candidate, where it is not: the tie rule's step, then the k
    changes the simplification removed. Each compares two candidates the search measured, as the rule did."""
    lines = []
    best, tied, final = result.best_by_loss, result.tie_winner, result.final
    if tied.key != best.key:
        lines.append(
            f"the tie rule chose {_form(tied.schedule)} over the best-scoring candidate {_form(best.schedule)} "
            f"(tied with it: no band beyond the margin, the paired total within one margin): {_reason(tied, best)}; "
            f"they differ at {_where(best.schedule, tied.schedule, result.reach)}"
        )
    if final.key != tied.key:
        removed = "speculation turned off" if final.schedule is None else _where(tied.schedule, final.schedule,
                                                                                  result.reach)  # fmt: skip
        lines.append(
            f"k changes with no predicted effect removed ({removed}, from {_form(tied.schedule)}): each removal "
            "left no band slower than the schedule before it beyond the margin (median over seeds, paired)"
        )
    return lines


def _form(schedule: list[list[int]] | None) -> str:
    return "speculation off" if schedule is None else json.dumps(schedule)


def _reason(chosen: Choice, other: Choice) -> str:
    (prior, segments, _), (other_prior, other_segments, _) = chosen.tie, other.tie
    if prior < other_prior:
        return "closer to the fixed-batch oracle's k"
    if chosen.schedule is None:
        return "as close to the oracle's k, and speculation off is simpler than any schedule"
    if segments < other_segments:
        return f"as close to the oracle's k, with fewer k changes ({segments - 1} instead of {other_segments - 1})"
    return "as close to the oracle's k, as few k changes, and smaller k"


def _where(a: list[list[int]] | None, b: list[list[int]] | None, reach: int) -> str:
    return ", ".join(differences(a, b, reach)) or "no batch the traffic reached"
