"""`specdrill tune`'s files and words: the schedule as vLLM's speculative_config, the predicted operating map
against the campaign's arms, and a rehearsal campaign with the tuned arm beside the measured ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.prediction_check import Prediction
from orchestrator.campaign import Campaign
from orchestrator.decide.played import drafter_arms
from orchestrator.decide.prediction import TUNED, predict
from orchestrator.decide.scoring import Objective
from orchestrator.decide.tune import OFF, Choice, Tuned, TuneResult, tune
from orchestrator.decide.tune_proof import oracle_gap
from orchestrator.decide.tune_simplify import differences
from serve_apps.engine_kinds.simulated import as_simulated
from serve_apps.sim.profile import Profile, load_profile

PREDICTION = "prediction.json"
REHEARSAL = "rehearsal-campaign.yaml"
CONFIG = "speculative-config.yaml"
RESULT = "tune.json"
# The rehearsal's campaign seed is the campaign's plus this: traffic draws (and engine seeds) the prediction never
# played, so a rehearsal in virtual time tests the prediction instead of replaying it.
REHEARSAL_SEED_OFFSET = 1000
TIE_RULE = (
    "ties (no band worse beyond the margin, the paired total within one margin) go to the fixed-batch oracle's k "
    "(k within its tolerance of its best count as equal), then to the simpler schedule (fewer k changes; speculation "
    "off is the simplest), then to the smaller k; a k change is removed where neither the traffic nor the oracle "
    "predicts an effect beyond the margin"
)


class TuneOutputs(BaseModel):
    model_config = ConfigDict(frozen=True)
    result: TuneResult
    prediction: Prediction
    rehearsal: dict[str, Any]
    files: dict[str, str]
    lines: list[str]


def profile_reference(name: str) -> str:
    """A profile file by its absolute path (the rehearsal may run from elsewhere), a shipped one by name."""
    path = Path(name)
    return str(path.resolve()) if path.suffix in {".yaml", ".yml"} or path.exists() else name


def with_profile(campaign: Campaign, profile: str | None) -> tuple[Campaign, Profile, str]:
    engine = as_simulated(campaign.engine)  # tune runs simulated campaigns (require_simulated)
    name = profile_reference(profile or engine.profile)
    loaded = load_profile(name)
    return campaign.model_copy(update={"engine": engine.model_copy(update={"profile": name})}), loaded, name


def single_topology(campaign: Campaign) -> str:
    return next(name for name, t in campaign.topologies.items() if t.kind == "single")


def rehearsal_campaign(campaign: Campaign, tuned: Tuned, seeds: int, out_dir: Path) -> dict[str, Any]:
    """The campaign's arms with the tuned schedule beside them on one engine, the same shapes and mix on traffic
    seeds the prediction never played (REHEARSAL_SEED_OFFSET, each repeat a fresh draw as the prediction's were)
    and the prediction's offered-rate bands, into OUT_DIR/rehearsal, naming the prediction its report is
    compared with."""
    data = campaign.model_dump(mode="json", by_alias=True, exclude_none=True)
    arms = data.get("arms") or [{"policy": p, "topology": t} for p in campaign.policies for t in campaign.topologies]
    result = tuned.result
    if result.speculative_config is not None:
        assert result.schedule is not None
        ev = tuned.evaluator
        data["policies"] = {
            **data["policies"],
            TUNED: {
                "kind": "dynamic",
                "method": ev.method,
                "model": ev.model,
                "max_k": int(result.speculative_config["num_speculative_tokens"]),  # type: ignore[call-overload]
                "schedule": result.schedule,
            },
        }
        arms = [*arms, {"policy": TUNED, "topology": single_topology(campaign)}]
    data.update(
        arms=arms, repeats=seeds, name=f"{campaign.name}-tuned"[:41], output=str((out_dir / "rehearsal").resolve()),
        prediction=str((out_dir / PREDICTION).resolve()), seed=campaign.seed + REHEARSAL_SEED_OFFSET,
        load={**data.get("load", {}), "repeat_traffic": "fresh"},
    )  # fmt: skip
    # The prediction's bands, pinned: automatic ones would sit at the quantiles of the new draws' rates, and the
    # report compares band by band by label (on the test ramp 2 of 5 labels moved with the seed).
    edges = [band.low for band in result.bands.bands]
    if len(edges) >= 2:
        data["analysis"] = {**data.get("analysis", {}), "rate_bands": edges}
    Campaign.model_validate(data)  # what `specdrill run` / `simulate` will read must be a valid campaign
    return data


def run_tune(
    campaign: Campaign, *, profile: str | None, objective: Objective, seeds: int, out_dir: Path, budget: int,
    max_k: int | None = None,
) -> TuneOutputs:  # fmt: skip
    campaign, loaded, profile_name = with_profile(campaign, profile)
    tuned = tune(campaign, loaded, objective=objective, seeds=seeds, max_k=max_k, budget=budget)
    return write_tune(campaign, tuned, loaded, profile_name, objective=objective, seeds=seeds, out_dir=out_dir)


def write_tune(
    campaign: Campaign, tuned: Tuned, loaded: Profile, profile_name: str, *, objective: Objective, seeds: int,
    out_dir: Path,
) -> TuneOutputs:  # fmt: skip
    """The files and words of a search already made on `campaign` (as with_profile returned it)."""
    result, ev = tuned.result, tuned.evaluator
    traffic = ev.traffic
    off_name = traffic.template.name
    played = {arm.name: traffic.play(arm.policy, arm.name) for arm in drafter_arms(traffic.campaign)}
    tuned_arm = off_name if result.winner == OFF else f"{TUNED}-{single_topology(campaign)}"
    played[tuned_arm] = ev.played[result.winner]
    prediction = predict(
        campaign.name, profile_name, result.schedule, ev.played[OFF], {off_name: ev.played[OFF], **played},
        tuned_arm, result.bands,
    )  # fmt: skip
    rehearsal = rehearsal_campaign(campaign, tuned, seeds, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {name: str(out_dir / name) for name in (PREDICTION, REHEARSAL, CONFIG, RESULT)}
    Path(files[PREDICTION]).write_text(prediction.model_dump_json(indent=1))
    Path(files[REHEARSAL]).write_text(yaml.safe_dump(rehearsal, sort_keys=False))
    snippet = {"speculative_config": result.speculative_config} if result.speculative_config else {}
    Path(files[CONFIG]).write_text(yaml.safe_dump(snippet, sort_keys=False) if snippet else "# speculation off\n")
    gap = oracle_gap(tuned.oracle, result.schedule, loaded.limits.max_num_seqs)
    Path(files[RESULT]).write_text(json.dumps({**result.model_dump(mode="json"), "oracle_gap": gap}, indent=1))
    lines = describe(result, prediction, tuned_arm, objective)
    lines.append(
        f"rehearse it on traffic the prediction never played (seed {rehearsal['seed']}): specdrill simulate "
        f"{files[REHEARSAL]} (or specdrill run it on a cluster)"
    )
    return TuneOutputs(result=result, prediction=prediction, rehearsal=rehearsal, files=files, lines=lines)


def describe(result: TuneResult, prediction: Prediction, tuned_arm: str, objective: Objective) -> list[str]:
    start = json.dumps(result.start_schedule)
    if result.start_schedule != result.oracle_schedule:
        start += f" (as measured {json.dumps(result.oracle_schedule)}; k changes within its own tolerance removed)"
    lines = [
        f"searched {result.candidates} candidate schedules in {result.seconds:.1f} s (virtual time, "
        f"{prediction.seeds} seeds each), from the fixed-batch oracle's {start}",
    ]
    if result.stopped_by_budget:
        unimproved = "; it is the oracle's start, unimproved" if result.winner == result.start else ""
        lines.append(
            f"stopped by the budget after {result.candidates} candidates (not converged, --budget {result.budget}): "
            f"what follows is the best found so far, not a tuned schedule{unimproved}"
        )
    lines += [
        f"objective per offered-rate band: SLO goodput first, then {objective.label}; a difference counts beyond "
        f"the margin, over seeds by median -/+ 1.4826 MAD; {TIE_RULE}",
        f"the traffic reached batch {result.reach}: above it the oracle's k is kept (nothing there to measure)",
    ]
    if result.noisy_bands:
        lines.append(f"not scored (noisy over seeds, relative MAD > 0.1): {', '.join(result.noisy_bands)}")
    found = "best found before the budget stopped the search" if result.stopped_by_budget else "best"
    if result.speculative_config is None:
        lines.append(f"{found}: speculation off in every band (no schedule beat it beyond the margin)")
    else:
        frame = "schedule" if not result.stopped_by_budget else f"{found}, as a schedule"
        lines.append(f"{frame} in vLLM's own batch frame (the batch the engine running it reaches):")
        lines.append(yaml.safe_dump({"speculative_config": result.speculative_config}, sort_keys=False,
                                    default_flow_style=None).rstrip())  # fmt: skip
    lines += tie_lines(result)
    lines.append("predicted per-token speedup vs off per band, median [lowest, highest seed]:")
    for band in prediction.predicted:
        parts = [f"{arm} {p.speedup.text()}" for arm, p in band.arms.items() if arm != prediction.tuned_arm]
        tuned = band.arms[tuned_arm].speedup.text()
        lines.append(f"  {band.band} req/s: {tuned_arm} {tuned}; " + "; ".join(parts))
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
            f"k changes with no predicted effect removed ({removed}, from {_form(tied.schedule)}): each removal kept "
            "every band within the margin of the schedule before it, the paired total within one margin, and gave up "
            "no more of the oracle's speedup"
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
