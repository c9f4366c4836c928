"""`specdrill run`: campaign -> arms -> traffic -> traces, one (arm, shape, repeat) unit at a time, resumable.

For each arm: deploy it, warm it up, run every shape (and repeat) with the same seeded arrivals and prompts as
every other arm, collect the worker traces and the engine step timelines, tear it down. A unit is complete
when its marker exists; running the campaign again skips complete units and redoes a partial one (its part
files are deleted first, so the traces never hold a row twice). What the run directory holds and how a campaign
splits into units and worker plans is orchestrator.rundir.layout's; this module is the loop on Ray.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from loadshapes.tokens import TokenizerUnavailable, tokenizer_json
from orchestrator.execute.deploy import connect, deploy, preflight, proxy_routes, teardown_arms
from orchestrator.execute.endpoint_scrape import MetricsSampler, speculation_counters
from orchestrator.execute.load_workers import LoadWorkers
from orchestrator.execute.runner import OnUnit, Work, arm_by_arm, run_units
from orchestrator.logs import get_logger
from orchestrator.plan.campaign import Campaign, CampaignError
from orchestrator.rundir.endpoint_samples import write_samples
from orchestrator.rundir.layout import MANIFEST, RunStore, Unit, UnitResult
from orchestrator.rundir.manifest import arm_entry, open_run, plans_for
from orchestrator.rundir.unit_files import merge_parts, rows_on_disk, unit_tpot_p50, write_timeline
from serve_apps.arms import ArmSpec, prompt_tokenizer_name
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.placement import plan_placement
from timebase.clock import now_ns

log = get_logger(__name__)


def fetch_timelines(
    url: str, *, replicas: int, since: dict[str, int], begin_unit: bool = False
) -> dict[str, dict[str, list[Any]]]:
    """Each engine's steps since the last fetch, keyed by engine id: a replica answers with every rank's steps
    (a vLLM data-parallel replica runs several engines, one per rank, told apart by `dp_rank`), split here into
    one entry per rank's engine. Serve routes each GET to one replica, so ask until every replica answered (or
    enough tries that a missing one is really missing). `since` counts rows per replica. `begin_unit` (before a
    unit, nothing in flight): every replica that answers starts its policy state afresh, as a virtual-time unit's
    engine does (a replica asked twice resets twice: harmless with no step between)."""
    seen: dict[str, dict[str, list[Any]]] = {}
    answered: set[str] = set()
    query = "since_step=0&begin_unit=true" if begin_unit else "since_step=0"
    for _ in range(max(4, 8 * replicas)):
        try:
            with urllib.request.urlopen(f"{url}/specdrill/timeline?{query}", timeout=60) as response:
                data = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # not a specdrill arm (an endpoint campaign): no step timeline to collect
                return {}
            raise
        replica = str(data.pop("engine_id"))
        rank_ids = {int(rank): str(engine) for rank, engine in (data.pop("engine_ids", None) or {}).items()}
        if replica not in answered:
            answered.add(replica)
            start = since.get(replica, 0)
            rows = {name: values[start:] for name, values in data.items()}
            since[replica] = len(data.get("start", []))
            seen.update(split_ranks(replica, rank_ids, rows))
        if len(answered) >= replicas:
            break
    return seen


def split_ranks(replica: str, rank_ids: dict[int, str], rows: dict[str, list[Any]]) -> dict[str, dict[str, list[Any]]]:
    """One replica's rows, one entry per rank's engine id (a rank the replica did not name gets `<replica>/dp<r>`)."""
    n = len(rows.get("start", []))
    ranks = rows.get("dp_rank") or [0] * n
    if len(set(ranks)) <= 1:
        rank = ranks[0] if ranks else 0
        return {rank_ids.get(rank, replica if rank == 0 else f"{replica}/dp{rank}"): rows}
    out: dict[str, dict[str, list[Any]]] = {}
    for rank in sorted(set(ranks)):
        picked = [i for i, r in enumerate(ranks) if r == rank]
        engine = rank_ids.get(rank, f"{replica}/dp{rank}")
        out[engine] = {name: [values[i] for i in picked] for name, values in rows.items()}
    return out


def replicas_of(arm: ArmSpec) -> int:
    """Serve replicas of the arm (a vLLM data-parallel group is one replica running every rank)."""
    return plan_placement(arm).replicas


def auth_headers(campaign: Campaign) -> dict[str, str]:
    """Only endpoint campaigns carry a key, read from the environment here and nowhere else."""
    key_env = kind_of(campaign.engine).api_key_env(campaign.engine)
    if key_env:
        key = os.environ.get(key_env)
        if not key:
            raise CampaignError(f"engine.api_key_env: environment variable {key_env} is not set")
        return {"Authorization": f"Bearer {key}"}
    return {}


def warm(url: str, arm: ArmSpec, requests: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """`requests` unmeasured requests; returns the last response's telemetry (what the arm says it runs). With none,
    a specdrill arm's /specdrill/info says the same without generating; a foreign server has none to say."""
    telemetry: dict[str, Any] = {}
    if requests == 0:
        info = urllib.request.Request(f"{url}/specdrill/info", headers=headers or {})
        try:
            with urllib.request.urlopen(info, timeout=30) as response:
                answer = json.loads(response.read())
                return answer if isinstance(answer, dict) else {}
        except (urllib.error.URLError, ValueError):
            return telemetry
    for _ in range(requests):
        body = json.dumps({"model": arm.served_model_name, "prompt": "warm up " * 8, "max_tokens": 8}).encode()
        request = urllib.request.Request(
            f"{url}/v1/completions", data=body, headers={"content-type": "application/json", **(headers or {})}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            telemetry = json.loads(response.read()).get("specdrill", {})
    return telemetry


def check_endpoints(campaign: Campaign, arms: Sequence[str] | None = None) -> None:
    """Before anything runs: every endpoint of the arms to run answers, or a one-line error names the
    unreachable one (arms run in separate calls may have their servers up at different times)."""
    urls = kind_of(campaign.engine).urls(campaign.engine)
    if not urls:
        return
    headers = auth_headers(campaign)
    for name, url in urls.items():
        if arms is not None and name not in arms:
            continue
        request = urllib.request.Request(f"{url}/v1/models", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            raise CampaignError(f"engine.urls.{name}: {url} answered HTTP {exc.code} to /v1/models") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CampaignError(f"engine.urls.{name}: {url} is unreachable ({reason})") from None


def check_tokenizer(campaign: Campaign) -> None:
    """Before anything deploys: the tokenizer prompt lengths are counted in loads here, where the run starts (the
    load workers get it in their plans), or one line says why."""
    name = prompt_tokenizer_name(campaign.engine)
    if name is None:
        return
    try:
        tokenizer_json(name)
    except TokenizerUnavailable as exc:
        field = kind_of(campaign.engine).tokenizer_field(campaign.engine)
        raise CampaignError(
            f"{field}: {exc} (prompt lengths are counted in its tokens where the run starts; "
            "`specdrill models pull CAMPAIGN --here` caches a Hugging Face model here)"
        ) from None


def run_unit(
    campaign: Campaign,
    arm: ArmSpec,
    unit: Unit,
    *,
    run: str,
    url: str,
    store: RunStore,
    since: dict[str, int],
    workers: LoadWorkers,
) -> UnitResult:
    """The unit's load through the workers, its rows merged and its step timeline written (the marker is the
    runner's, orchestrator.execute.runner)."""
    plans = plans_for(campaign, arm, unit, run=run, url=url, traces=store.traces)
    # A foreign server gets no request to specdrill's own endpoints: its engine is sampled from /metrics instead,
    # in its kind's metrics dialect.
    kind = kind_of(campaign.engine)
    endpoint = kind.telemetry == "server_metrics"
    if not endpoint:
        # Skip steps from warm-up and earlier units, and start the engines' policy state afresh
        fetch_timelines(url, replicas=replicas_of(arm), since=since, begin_unit=True)
    key_env = plans[0].target.api_key_env
    secrets = {key_env: os.environ[key_env]} if key_env and key_env in os.environ else None
    dialect = kind.dialect if endpoint else None
    with MetricsSampler(url, auth_headers(campaign), dialect) if dialect else nullcontext() as sampler:
        summaries = workers.run(
            plans,
            ready_timeout_s=campaign.load.ready_timeout_s,
            env=secrets,  # to the worker processes' environment only: never in a plan, a trace or a log
            # Each worker through its own node's Serve proxy where it has one (on a cluster, not every node does).
            routes=None if endpoint else proxy_routes(campaign, arm),
        )
    if sampler is not None:
        write_samples(store.root, unit.arm, unit.shape, unit.repeat, sampler.table())
    # A foreign server has no step timeline: nothing is asked of it and no file is written (its steps come from
    # the trace's per-step lists).
    timelines: dict[str, dict[str, list[Any]]] = {}
    steps = 0
    if not endpoint:
        timelines = fetch_timelines(url, replicas=replicas_of(arm), since=since)
        steps = write_timeline(store, unit, timelines)
    start = min(s.start_ns or 0 for s in summaries)
    rows = sum(s.rows_written for s in summaries if not s.lost)
    if any(s.lost for s in summaries):
        rows += rows_on_disk(store, unit, [s.worker for s in summaries if s.lost])
    result = UnitResult(
        unit=unit,
        start_ns=start,
        end_ns=now_ns(),
        duration_s=campaign.shapes[unit.shape].duration,
        scheduled=sum(s.scheduled for s in summaries),
        rows=rows,
        saturated=any(s.saturated for s in summaries),
        lateness_p99_s=max(s.lateness_p99_s for s in summaries),
        workers=summaries,
        timeline_steps=steps,
        incomplete=any(s.lost for s in summaries),
        missing=sum(s.scheduled for s in summaries) - rows,
        tpot_p50_s=unit_tpot_p50(store, unit),
        **engine_lag_of(timelines, bound=campaign.load.engine_lag_bound),
    )
    # Merged before the marker: until the marker exists a crash leaves a partial unit, redone whole.
    return result.model_copy(update={"trace_file": merge_parts(store, unit)})


def engine_lag_of(timelines: dict[str, dict[str, list[Any]]], *, bound: float) -> dict[str, Any]:
    """The unit's engine lag summary (UnitResult's engine_lag_* fields) from the engines' step timelines: empty
    when no engine reported lag (vLLM, endpoints), so those fields keep their defaults.

    The flag is on the lag's share of the model's step time (summed over the unit's steps), not on a tail
    quantile: a late step delays the next one by as much, so that share is how much slower than its model the
    engine ran, i.e. how much of every per-token latency in the unit is the host's. A p99 is reported but held to
    nothing: a loaded host has a few long scheduling stalls even where the pace is kept (measured on this 2-core
    machine: p99 13 ms at 2 req/s with a share of 13%, 98 ms where the share reached 95%)."""
    lags = [float(x) for data in timelines.values() for x in (data.get("lag_s") or []) if x is not None]
    if not lags:
        return {}
    values = np.asarray(lags)
    model_s = sum(
        e - s
        for data in timelines.values()
        if data.get("lag_s")
        for s, e in zip(data["start"], data["end"], strict=True)
    )
    share = float(values.sum() / model_s) if model_s > 0 else 0.0
    return {
        "engine_lag_p50_s": float(np.quantile(values, 0.5)),
        "engine_lag_p99_s": float(np.quantile(values, 0.99)),
        "engine_lag_max_s": float(values.max()),
        "engine_lag_share": share,
        "engine_lag_bound": bound,
        "engine_lagged": share > bound,
    }


def arm_urls(campaign: Campaign, deployable: Campaign, names: Sequence[str], *, address: str | None) -> dict[str, str]:
    """The base URL of each named arm: an endpoint campaign's own servers, else the arms deployed on Ray Serve
    now (`deployable` is what `preflight` returned)."""
    kind = kind_of(campaign.engine)
    if not kind.deploys_in_serve:
        return {name: kind.urls(campaign.engine)[name] for name in names}
    return deploy(deployable, address=address, only=list(names))


def warmed_entry(campaign: Campaign, arm: ArmSpec, url: str) -> dict[str, Any]:
    """The arm's manifest entry after its warm-up requests (with the endpoint's key): what it says it runs, from
    its telemetry, or for a foreign server without any, its /metrics speculation counters."""
    headers = auth_headers(campaign)
    telemetry = warm(url, arm, campaign.warmup.requests, headers)
    entry = arm_entry(arm, url, telemetry)
    kind = kind_of(campaign.engine)
    if kind.telemetry == "server_metrics" and not telemetry:
        entry["metrics_spec_decode"] = speculation_counters(url, headers, kind.dialect)
    return entry


class RayExecutor:
    """Units in real time on Ray: the checks before anything deploys (tokenizer, endpoints, the layout these
    nodes can run) made when it is built, one set of load worker actors for the run (spread over the nodes, a
    Locust process per unit), arms deployed and warmed as they come up (an endpoint campaign's servers used as
    they are) and torn down after."""

    def __init__(self, campaign: Campaign, *, address: str | None, arms: Sequence[str] | None = None) -> None:
        check_tokenizer(campaign)
        check_endpoints(campaign, arms)
        connect(address)
        # A layout these nodes cannot run is refused before any arm deploys and before the run directory exists.
        self.deployable = preflight(campaign)
        self.campaign = campaign
        self.address = address
        self.urls: dict[str, str] = {}
        self.since: dict[str, dict[str, int]] = {}  # per arm: timeline rows already fetched, per replica
        self.workers: LoadWorkers | None = None

    @contextmanager
    def session(self) -> Iterator[None]:
        with LoadWorkers(cpus_per_worker=self.campaign.load.cpus_per_worker) as workers:
            self.workers = workers
            try:
                yield
            finally:
                self.workers = None

    @contextmanager
    def arms_up(self, campaign: Campaign, arms: Sequence[ArmSpec], manifest: dict[str, Any]) -> Iterator[None]:
        names = [a.name for a in arms]
        if not names:
            yield
            return
        self.urls.update(arm_urls(campaign, self.deployable, names, address=self.address))
        try:
            for arm in arms:
                manifest["arms"][arm.name] = warmed_entry(campaign, arm, self.urls[arm.name])
                self.since[arm.name] = {}
            yield
        finally:
            if kind_of(campaign.engine).deploys_in_serve:
                teardown_arms([a.app_name for a in arms])

    def run_unit(self, work: Work, *, run: str, store: RunStore) -> UnitResult:
        assert self.workers is not None, "units run inside the executor's session"
        return run_unit(work.campaign, work.arm, work.unit, run=run, url=self.urls[work.arm.name], store=store,
                        since=self.since[work.arm.name], workers=self.workers)  # fmt: skip


def run_campaign(
    campaign: Campaign,
    *,
    address: str | None = None,
    on_unit: OnUnit | None = None,
    arms: Sequence[str] | None = None,
) -> tuple[RunStore, dict[str, Any]]:
    """Run every pending unit of every arm, one arm deployed at a time; returns the run store and the final
    manifest. `on_unit(unit, "start", None)` before a unit, `on_unit(unit, "done", result)` after it."""
    campaign.require_traffic()
    executor = RayExecutor(campaign, address=address, arms=arms)
    store = RunStore(campaign.output_dir())
    manifest = open_run(campaign, store)
    store.write_json(MANIFEST, manifest)
    run_units(arm_by_arm(campaign, store, arms), executor, store=store, manifest=manifest, on_unit=on_unit)
    return store, manifest
