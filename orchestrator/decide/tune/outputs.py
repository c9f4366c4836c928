"""`specdrill tune`'s files: the answer as vLLM's speculative_config, the predicted operating map against the
campaign's arms on the topology answered for, and a rehearsal campaign with the tuned arm beside the measured ones
(its words: tune_words.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.analysis.steps.prediction_check import Prediction
from orchestrator.decide.oracle import Oracle
from orchestrator.decide.scoring import Objective
from orchestrator.decide.tune.build import Tuned, TuneResult
from orchestrator.decide.tune.categories import category_lines
from orchestrator.decide.tune.prediction import TUNED, predict
from orchestrator.decide.tune.progress import TuneProgress, silent
from orchestrator.decide.tune.simplify import k_table
from orchestrator.decide.tune.static import tune_on
from orchestrator.decide.tune.topology import TopologyChoice, TopologyTraffic, arms_on, choose_topology
from orchestrator.decide.tune.words import describe
from orchestrator.plan.arms import arm_name
from orchestrator.plan.campaign import Campaign
from serve_apps.engine_kinds.simulated import as_simulated
from serve_apps.policies import Topology, parse_topology
from serve_apps.sim.profile import Profile, load_profile

PREDICTION = "prediction.json"
REHEARSAL = "rehearsal-campaign.yaml"
CONFIG = "speculative-config.yaml"
RESULT = "tune.json"
# The rehearsal's campaign seed is the campaign's plus this: traffic draws (and engine seeds) the prediction never
# played, so a rehearsal in virtual time tests the prediction instead of replaying it.
REHEARSAL_SEED_OFFSET = 1000


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


def answer_topology(campaign: Campaign, result: TuneResult) -> Topology:
    return campaign.topologies.get(result.topology_name) or parse_topology(result.topology)


def off_policy(campaign: Campaign) -> str:
    """The campaign's `off` policy name ("off" where it has none: the rehearsal adds it)."""
    names = [n for n, raw in campaign.policies.items() if (raw if isinstance(raw, str) else raw.get("kind")) == "off"]
    return names[0] if names else "off"


def rehearsal_campaign(campaign: Campaign, tuned: Tuned, seeds: int, out_dir: Path) -> dict[str, Any]:
    """The campaign's arms with the tuned answer beside them on the topology answered for (and `off` there, where
    the campaign has none), the same shapes and mix on traffic seeds the prediction never played
    (REHEARSAL_SEED_OFFSET, each repeat a fresh draw as the prediction's were) and the prediction's offered-rate
    bands, into OUT_DIR/rehearsal, naming the prediction its report is compared with."""
    data = campaign.model_dump(mode="json", by_alias=True, exclude_none=True)
    arms = data.get("arms") or [{"policy": p, "topology": t} for p in campaign.policies for t in campaign.topologies]
    result = tuned.result
    topology = result.topology_name
    if topology not in data["topologies"]:
        data["topologies"] = {**data["topologies"], topology: result.topology}
    off = off_policy(campaign)
    if off not in data["policies"]:
        data["policies"] = {**data["policies"], off: "off"}
    if {"policy": off, "topology": topology} not in arms:
        arms = [*arms, {"policy": off, "topology": topology}]
    if result.speculative_config is not None:
        assert result.schedule is not None
        ev = tuned.evaluator
        drafter = {"method": ev.method, "model": ev.model}
        k = int(result.speculative_config["num_speculative_tokens"])  # type: ignore[call-overload]
        policy = {"kind": "fixed", **drafter, "k": k} if result.static is not None else {
            "kind": "dynamic", **drafter, "max_k": k, "schedule": result.schedule}  # fmt: skip
        data["policies"] = {**data["policies"], TUNED: policy}
        arms = [*arms, {"policy": TUNED, "topology": topology}]
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
    max_k: int | None = None, topology: str | None = None, progress: TuneProgress | None = None,
) -> TuneOutputs:  # fmt: skip
    """`topology`: the campaign's short form (None: the campaign's, tune_topology.choose_topology); `progress`:
    where the lines said while it searches go (the command: stderr)."""
    campaign, loaded, profile_name = with_profile(campaign, profile)
    choice: TopologyChoice = choose_topology(campaign, topology)
    said = progress or silent()
    tuned = tune_on(campaign, loaded, choice, objective=objective, seeds=seeds, max_k=max_k, budget=budget,
                    progress=said)  # fmt: skip
    said.stage("playing the campaign's arms for the prediction and writing the files")
    return write_tune(campaign, tuned, loaded, profile_name, objective=objective, seeds=seeds, out_dir=out_dir)


def write_tune(
    campaign: Campaign, tuned: Tuned, loaded: Profile, profile_name: str, *, objective: Objective, seeds: int,
    out_dir: Path,
) -> TuneOutputs:  # fmt: skip
    """The files and words of a search already made on `campaign` (as with_profile returned it)."""
    result, ev = tuned.result, tuned.evaluator
    topology = answer_topology(campaign, result)
    traffic = TopologyTraffic.on(ev.traffic, topology)  # the campaign's arms as they run there (DP: static k)
    off_name = arm_name(off_policy(campaign), result.topology_name)
    played = {arm.name: traffic.play(arm.policy, arm.name) for arm in arms_on(campaign, topology)
              if arm.policy.kind != "off"}  # fmt: skip
    tuned_arm = off_name if result.speculative_config is None else arm_name(TUNED, result.topology_name)
    played[tuned_arm] = tuned.played
    prediction = predict(
        campaign.name, profile_name, result.schedule, tuned.off, {off_name: tuned.off, **played}, tuned_arm,
        result.bands,
    )  # fmt: skip
    rehearsal = rehearsal_campaign(campaign, tuned, seeds, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {name: str(out_dir / name) for name in (PREDICTION, REHEARSAL, CONFIG, RESULT)}
    Path(files[PREDICTION]).write_text(prediction.model_dump_json(indent=1))
    Path(files[REHEARSAL]).write_text(yaml.safe_dump(rehearsal, sort_keys=False))
    snippet = {"speculative_config": result.speculative_config} if result.speculative_config else {}
    Path(files[CONFIG]).write_text(yaml.safe_dump(snippet, sort_keys=False) if snippet else "# speculation off\n")
    gap = oracle_gap(tuned.oracle, result.schedule, loaded.limits.max_num_seqs)
    checks = category_lines(tuned.played, tuned.off, MapSettings().margin, result.bands)
    Path(files[RESULT]).write_text(json.dumps({**result.model_dump(mode="json"), "oracle_gap": gap,
                                               "category_checks": checks}, indent=1))  # fmt: skip
    lines = describe(result, prediction, tuned_arm, objective)
    lines += checks
    lines.append(
        f"rehearse it on traffic the prediction never played (seed {rehearsal['seed']}): specdrill simulate "
        f"{files[REHEARSAL]} (or specdrill run it on a cluster)"
    )
    return TuneOutputs(result=result, prediction=prediction, rehearsal=rehearsal, files=files, lines=lines)


def oracle_gap(truth: Oracle, schedule: list[list[int]] | None, top: int) -> list[tuple[int, int, int, float]]:
    """tune.json's record: per oracle batch size, (batch, the answer's k, the oracle's best k, the best k's speedup
    over off minus the answer's k's), speedups from the oracle's fixed-batch per-token latency."""
    ks = k_table(schedule, top)
    rows = []
    for point in truth.points:
        k = min(ks[min(point.batch_size, top) - 1], truth.max_k)
        off = point.tpot_p50_s[0]
        best = off / point.tpot_p50_s[point.best_k]
        rows.append((point.batch_size, k, point.best_k, float(best - off / point.tpot_p50_s[k])))
    return rows
