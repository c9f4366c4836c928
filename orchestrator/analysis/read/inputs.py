"""A run directory as the report, recommend and calibrate read it: the manifest's campaign, the complete units
(their trace files checked and stamped once), the arms to analyse with their baselines, and what is not run yet."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from loadshapes.badfile import BadFileError
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.plan.arms import CampaignArms
from orchestrator.plan.baselines import baselines
from orchestrator.plan.campaign import Campaign, campaign_with_arms
from orchestrator.rundir.evidence import check_unit_evidence, traces_digest
from orchestrator.rundir.layout import MANIFEST, RunStore, TraceStamp, UnitResult
from orchestrator.rundir.manifest import read_manifest, units_of
from serve_apps.config_io import first_error
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.vllm_versions import VllmTarget, minor_of


@dataclass(frozen=True)
class RunInputs:
    store: RunStore
    manifest: dict[str, Any]
    campaign: Campaign
    # The campaign's arms (ArmSpec), profile and max_num_seqs, derived once at load: read these, not the campaign
    planned: CampaignArms
    units: list[UnitResult]
    arms: list[ArmInfo]
    not_run: list[str]  # units the campaign plans that are not complete (an interrupted or unfinished run)
    # Complete units left out of the analysis: their arm's baseline has no complete unit yet (nothing to pair with)
    waiting: list[str] = dataclasses.field(default_factory=list)
    # Every checked unit's trace files (unit key -> file name -> size and rows), read once when the run was loaded
    trace_files: dict[str, dict[str, TraceStamp]] = dataclasses.field(default_factory=dict)

    def traces_digest(self) -> str:
        """The digest summary.json's seal holds: the analysed units' trace files, as loaded."""
        return traces_digest({u.unit.key: self.trace_files[u.unit.key] for u in self.units})


def partial_run_line(inputs: RunInputs) -> str | None:
    if not inputs.not_run:
        return None
    planned = len(inputs.units) + len(inputs.waiting) + len(inputs.not_run)
    command = "simulate" if inputs.manifest.get("mode") == "virtual" else "run"
    listed = ", ".join(inputs.not_run[:3]) + (f" and {len(inputs.not_run) - 3} more" if len(inputs.not_run) > 3 else "")
    waiting = f"; {_listed(inputs.waiting)} not analysed yet (no unit of their baseline)" if inputs.waiting else ""
    return (
        f"partial run: {len(inputs.units) + len(inputs.waiting)} of {planned} units complete (not run: {listed})"
        f"{waiting}; the figures cover only the complete units: resume with specdrill {command} CAMPAIGN --output "
        f"{inputs.store.root}"
    )


def _listed(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def load_run(run_dir: str) -> RunInputs:
    """What the run wrote, checked as it is read: a missing, truncated or foreign file is one BadFileError."""
    store = RunStore(run_dir, create=False)
    if not store.exists(MANIFEST):
        raise BadFileError(store.root, f"no {MANIFEST} (not a specdrill run directory)")
    manifest = read_manifest(store)
    try:
        campaign, planned = campaign_with_arms(manifest["campaign"])
    except ValidationError as exc:
        raise BadFileError(store.path(MANIFEST), f"campaign: {first_error(exc)}") from None
    except ValueError as exc:
        raise BadFileError(store.path(MANIFEST), f"campaign: {exc}") from None
    specs = planned.arms
    planned_units = [u for arm in specs for u in units_of(campaign, arm)]
    units = [store.read_marker(u) for u in planned_units if store.is_complete(u)]
    not_run = [u.key for u in planned_units if not store.is_complete(u)]
    trace_files: dict[str, dict[str, TraceStamp]] = {}
    for unit in units:
        store.check_unit_files(unit)
        trace_files[unit.unit.key] = check_unit_evidence(store, unit, manifest["units"].get(unit.unit.key))
    max_num_seqs = planned.max_num_seqs
    # off on the same hardware, else on one engine per engine; none where the campaign asks for absolute figures
    compared = {} if campaign.analysis.absolute_only else baselines(specs)
    # A partial run: an arm whose baseline has no complete unit yet has nothing to be compared with; its units
    # wait (the partial-run line names them) rather than be analysed against a baseline that is not there.
    done = {u.unit.arm for u in units}
    waiting = [u.unit.key for u in units if compared and compared[u.unit.arm].baseline not in done]
    units = [u for u in units if u.unit.key not in waiting]
    if not units:
        command = "simulate" if manifest.get("mode") == "virtual" else "run"
        what = (
            f"{len(waiting)} complete ({_listed(waiting)}) but no unit of their baseline "
            f"({', '.join(sorted({compared[k.split('/', 1)[0]].baseline for k in waiting}))})"
            if waiting
            else "none complete"
        )
        raise BadFileError(store.root, f"nothing to analyse yet: {len(planned_units)} units planned, {what}; resume "
                                       f"with specdrill {command} CAMPAIGN --output {store.root}")  # fmt: skip
    arms = [
        ArmInfo.from_policy(
            arm.name,
            arm.policy,
            topology=arm.topology,
            max_num_seqs=max_num_seqs,
            compared_with=compared[arm.name].baseline if compared else None,
            engines_ratio=compared[arm.name].engines_ratio if compared else 1.0,
            vllm=engine_vllm(manifest, arm.name, kind_of(campaign.engine).replica_env(campaign.engine)),
            engine_warning=(manifest.get("arms", {}).get(arm.name) or {}).get("schedule_dropped_reason"),
        )
        for arm in specs
        if arm.name in {u.unit.arm for u in units}
    ]
    return RunInputs(store, manifest, campaign, planned, units, arms, not_run, waiting, trace_files)


def engine_vllm(manifest: dict[str, Any], arm: str, env: dict[str, str]) -> VllmTarget | None:
    """The vLLM the arm's replicas reported running (their engine's version), with the engine's env; None where
    the arm ran no vLLM engine (simulated, virtual, endpoints) or never reported."""
    engine = str(((manifest.get("arms", {}).get(arm) or {}).get("versions") or {}).get("engine", ""))
    if not engine.startswith("vllm/"):
        return None
    version = engine.removeprefix("vllm/")
    try:
        minor_of(version)
    except ValueError:
        return None
    return VllmTarget(version, env)
