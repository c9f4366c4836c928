"""`specdrill run` in virtual time: the same run directory, on the simulated engine, without Ray or HTTP.

Each (arm, shape, repeat) unit gets exactly the traffic the load workers would send, played into fresh simulated
engines (one per rank of the arm's topology, requests round-robin) in virtual time (orchestrator/virtual/). The
rows, step timelines, unit markers and manifest entries are the run directory `orchestrator.execute.ray_executor` writes
(orchestrator.rundir.layout), written by the same unit loop (orchestrator.execute.runner), so the report reads both; the
manifest says `"mode": "virtual"`.
"""

from __future__ import annotations

from typing import Any

from orchestrator.execute.runner import OnUnit, run_units, shape_by_shape
from orchestrator.plan.campaign import Campaign, CampaignError
from orchestrator.rundir.layout import RunStore
from orchestrator.rundir.manifest import open_run
from orchestrator.virtual.executor import VIRTUAL_EPOCH_NS, VirtualExecutor, unit_starts
from serve_apps.engine_kinds.registry import kind_of, kinds


def require_simulated(campaign: Campaign) -> None:
    if not kind_of(campaign.engine).runs_in_virtual_time:
        can = " or ".join(name for name, kind in kinds().items() if kind.runs_in_virtual_time)
        raise CampaignError(f"engine: kind {campaign.engine.kind!r} cannot run in virtual time; only kind: {can} can")
    # A session's later turn carries the answer the server sent and is sent after it: arrivals the virtual-time
    # simulator cannot precompute.
    played = campaign.mix.session_datasets
    if played:
        raise CampaignError(
            f"mix: sessions ({played[0]}) cannot run in virtual time: a later turn carries the answer the server "
            "sent, and is sent after it; run the campaign in real time (`specdrill run`) or drop `sessions`"
        )


def simulate_campaign(
    campaign: Campaign, *, output: str | None = None, on_unit: OnUnit | None = None
) -> tuple[RunStore, dict[str, Any]]:
    """`specdrill run` in virtual time: every pending unit of every arm; returns the run store and manifest.
    `on_unit` as run_campaign's: `(unit, "start", None)` before a unit, `(unit, "done", result)` after it.

    Units run shape by shape and repeat by repeat, every arm in turn, so each (shape, repeat)'s requests are
    built once; the results do not depend on the order (fresh engines per unit, fixed virtual time slots).
    """
    require_simulated(campaign)
    campaign.require_traffic()
    if output is not None:
        campaign = campaign.model_copy(update={"output": output})
    store = RunStore(campaign.output_dir())
    manifest = open_run(campaign, store, mode="virtual")
    manifest["virtual_epoch_ns"] = VIRTUAL_EPOCH_NS
    executor = VirtualExecutor(unit_starts(campaign))
    run_units(shape_by_shape(campaign, store), executor, store=store, manifest=manifest, on_unit=on_unit)
    return store, manifest
