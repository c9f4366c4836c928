"""Deploy a campaign's arms on Ray Serve, wait until each answers, tear them down again.

All or nothing: if any arm fails to come up or to answer its warm-up request, every arm this call deployed is
deleted before the error is raised.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from orchestrator.execute.ray_address import why_unreachable
from orchestrator.logs import get_logger
from orchestrator.plan.campaign import Campaign
from serve_apps.arms import ArmSpec
from serve_apps.config_io import first_error
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.placement import ArmPlacement, plan_placement

log = get_logger(__name__)

# Keep every Ray listener on loopback (docs/operator/security.md).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


class DeployError(RuntimeError):
    pass


class NoRayCluster(DeployError):
    """No Ray answers at the address given (--address, RAY_ADDRESS): a bad argument, exit 2."""


def connect(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    unreachable = why_unreachable(target)  # before ray.init, which retries a dead address for minutes
    if unreachable is not None:
        raise NoRayCluster(unreachable)
    # ray.init sets its own SIGTERM handler (sys.exit) in the main thread; one the caller installed (the
    # campaign's, orchestrator.execute.interrupts: how far it got, how to resume) is put back after it.
    caller = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        ray.init(address=target, namespace="specdrill", logging_level=logging.ERROR, log_to_driver=False)
    except ConnectionError as exc:
        raise DeployError(
            f"no Ray cluster at {target!r}: start one (infra/ray-up.sh or `ray start --head`) or set RAY_ADDRESS"
            f" ({exc})".replace("\n", " ")
        ) from None
    finally:
        if callable(caller):
            signal.signal(signal.SIGTERM, caller)


WILDCARD = "0.0.0.0"


def node_addresses() -> dict[str, str]:
    """{node id: the node's IP address} of every alive node of the connected cluster."""
    import ray

    return {str(n["NodeID"]): str(n["NodeManagerAddress"]) for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]


def serve_host(campaign: Campaign, addresses: Mapping[str, str]) -> str:
    """The address Serve's proxies bind. Loopback (the default) on one machine; on a cluster whose nodes have
    addresses of their own, every proxy binds its node's addresses (0.0.0.0: in a pod or a host, the node's own),
    so that a load worker on any node reaches one. One node's address would fail every other node's proxy."""
    from serve_apps.deployment import LOOPBACK

    host = campaign.serve.host
    if len(set(addresses.values())) <= 1:
        return host
    if host in LOOPBACK:
        return WILDCARD
    if host in addresses.values():
        raise DeployError(
            f"serve.host {host} is one node's address; on a cluster of {len(addresses)} nodes every node's Serve "
            f"proxy binds serve.host: use {WILDCARD} (each proxy on its own node's addresses) or leave it unset"
        )
    return host


def base_url(campaign: Campaign, arm: ArmSpec, host: str | None = None) -> str:
    """The arm's URL as this process reaches it: through its own node's proxy when Serve binds every address."""
    host = host or campaign.serve.host
    if host in (WILDCARD, "::"):
        import ray

        host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return f"http://{host}:{campaign.serve.port}{arm.route_prefix}"


def proxy_routes(campaign: Campaign, arm: ArmSpec) -> dict[str, str]:
    """{node id: the arm's URL through that node's Serve proxy}, for every node whose proxy is healthy now: the
    head's always, those of nodes holding the arm's replicas once up (Serve runs no proxy elsewhere). A load
    worker sends to its own node's proxy, or else to the head's (orchestrator.execute.load_workers)."""
    from ray import serve
    from ray.serve.schema import ProxyStatus

    addresses = node_addresses()
    host = serve_host(campaign, addresses)
    healthy = [node for node, status in serve.status().proxies.items() if status == ProxyStatus.HEALTHY]
    routes = {}
    for node in healthy:
        where = addresses.get(node) if host in (WILDCARD, "::") else host
        if where is not None:
            routes[node] = f"http://{where}:{campaign.serve.port}{arm.route_prefix}"
    return routes


def deploy(
    campaign: Campaign,
    *,
    address: str | None = None,
    timeout_s: float | None = None,
    only: Sequence[str] | None = None,
) -> dict[str, str]:
    """Deploy the campaign's arms (or only the named ones) and return {arm name: base URL}."""
    arms, _ = bring_up(campaign, address=address, timeout_s=timeout_s, only=only, probe=False)
    host = serve_host(campaign, node_addresses())
    urls = {arm.name: base_url(campaign, arm, host) for arm in arms}
    names = [arm.app_name for arm in arms]
    timeout = timeout_s or kind_of(campaign.engine).deploy_timeout_s
    try:
        for arm in arms:
            warm_up(urls[arm.name], arm, deadline=time.monotonic() + timeout)
    except BaseException:
        teardown_arms(names)
        raise
    log.info("deploy.done", apps=names)
    return urls


def check_deploy(
    campaign: Campaign, *, address: str | None = None, timeout_s: float | None = None
) -> dict[str, list[dict[str, Any]]]:
    """`specdrill deploy --check`: deploy each arm with the placement probe in place of its engine, collect what
    each replica found (its GPUs, the device of every DP rank and TP worker, the node of every bundle), tear it
    down again. Arm by arm, as `specdrill run` deploys them. Raises DeployError naming the first arm whose engine
    could not get its devices."""
    reports: dict[str, list[dict[str, Any]]] = {}
    for name in [arm.name for arm in campaign.arms()]:
        arms, plans = bring_up(campaign, address=address, timeout_s=timeout_s or 120.0, only=[name], probe=True)
        try:
            url = base_url(campaign, arms[0], serve_host(campaign, node_addresses()))
            reports[name] = _probe_reports(url, plans[name].replicas)
        finally:
            teardown_arms([arms[0].app_name])
    return reports


def bring_up(
    campaign: Campaign, *, address: str | None, timeout_s: float | None, only: Sequence[str] | None, probe: bool
) -> tuple[list[ArmSpec], dict[str, ArmPlacement]]:
    from ray import serve

    from serve_apps.deployment import build_arm_app

    if not kind_of(campaign.engine).deploys_in_serve:
        raise DeployError(f"engine kind {campaign.engine.kind}: the servers run elsewhere; there is nothing to deploy")
    connect(address)
    campaign = placed(campaign)
    arms = [arm for arm in campaign.arms() if only is None or arm.name in only]
    plans = {arm.name: plan_placement(arm) for arm in arms}
    check_capacity(arms, plans)
    host = serve_host(campaign, node_addresses())
    serve.start(proxy_location="EveryNode", http_options={"host": host, "port": campaign.serve.port})
    _check_listening(host, campaign.serve.port)
    timeout = timeout_s or kind_of(campaign.engine).deploy_timeout_s
    names = [arm.app_name for arm in arms]
    try:
        serve.run_many(
            [
                serve.RunTarget(
                    build_arm_app(arm, host, probe=probe),
                    name=arm.app_name,
                    route_prefix=arm.route_prefix,
                )
                for arm in arms
            ],
            wait_for_applications_running=False,
        )
        wait_running(names, deadline=time.monotonic() + timeout, autoscaling=campaign.resources.autoscaling)
    except BaseException:
        teardown_arms(names)
        raise
    return arms, plans


def preflight(campaign: Campaign, *, address: str | None = None) -> Campaign:
    """Before a campaign runs (arm by arm): every arm's layout runs on these nodes, and each arm alone fits.
    Returns the campaign placed on these nodes, for the arm-by-arm deploys (no second look at the cluster)."""
    if not kind_of(campaign.engine).deploys_in_serve:
        return campaign
    connect(address)
    campaign = placed(campaign)
    for arm in campaign.arms():
        check_capacity([arm], {arm.name: plan_placement(arm)})
    return campaign


def node_resources() -> list[dict[str, float]]:
    """Total resources of every alive node of the connected cluster."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]


def placed(campaign: Campaign) -> Campaign:
    """The campaign with resources.gpus_per_node read from the cluster when the file does not give it, validated
    again: a layout vLLM cannot run on these nodes is refused here, in one line, before anything deploys."""
    if campaign.resources.gpus_per_node is not None or campaign.resources.gpus_per_engine == 0:
        return campaign
    most = max((int(n.get("GPU", 0)) for n in node_resources()), default=0)
    if most == 0:
        if campaign.resources.autoscaling:
            return campaign
        raise DeployError(
            f"resources.gpus_per_engine is {campaign.resources.gpus_per_engine:g} but no node of the cluster has a "
            "GPU (set resources.autoscaling: true if the cluster adds GPU nodes on demand)"
        )
    data = campaign.model_dump(by_alias=True, exclude_unset=True)
    data["resources"] = {**data.get("resources", {}), "gpus_per_node": most}
    try:
        return Campaign.model_validate(data)
    except ValidationError as exc:
        raise DeployError(f"on this cluster ({most} GPUs per node at most): {first_error(exc)}") from None


def check_capacity(arms: Sequence[ArmSpec], plans: dict[str, ArmPlacement]) -> None:
    """Refuse at once what the nodes up now cannot hold, instead of waiting for replicas Ray can never place: each
    replica's bundles against the nodes' totals, all GPUs against what is free. Placement Ray can make is left
    to Ray (this is not a bin-packer)."""
    import ray

    if not arms or arms[0].resources.autoscaling:
        return
    nodes = node_resources()
    for arm in arms:
        plan = plans[arm.name]
        demand = plan.replica_demand()
        for bundle in demand:
            if not any(all(node.get(k, 0.0) >= v for k, v in bundle.items()) for node in nodes):
                biggest = max(nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)), default={})
                raise DeployError(
                    f"arm {arm.name} ({plan.layout} layout) needs {_resources(bundle)} on one node; the largest node "
                    f"has {_resources({k: biggest.get(k, 0.0) for k in bundle})}"
                )
        if plan.strategy == "STRICT_SPREAD" and len(demand) > sum(1 for n in nodes if n.get("GPU", 0.0) > 0):
            raise DeployError(f"arm {arm.name}: STRICT_SPREAD of {len(demand)} bundles needs as many GPU nodes")
    wanted = sum(plans[a.name].total_gpus for a in arms)
    free = float(ray.available_resources().get("GPU", 0.0))  # type: ignore[no-untyped-call]
    if wanted > free + 1e-9:
        raise DeployError(
            f"the arms need {wanted:g} GPUs together, the cluster has {free:g} free "
            f"(of {sum(n.get('GPU', 0.0) for n in nodes):g})"
        )


def _resources(bundle: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(bundle.items()))


def _probe_reports(url: str, replicas: int) -> list[dict[str, Any]]:
    """Every replica's probe report: Serve routes each GET to one replica, so ask until each has answered."""
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(max(8, 16 * replicas)):
        with urllib.request.urlopen(f"{url}/specdrill/placement", timeout=30) as response:
            report: dict[str, Any] = json.loads(response.read())
        seen.setdefault(str(report["replica_id"]), report)
        if len(seen) >= replicas:
            break
    return list(seen.values())


def _check_listening(host: str, port: int) -> None:
    """Serve keeps the HTTP address it started with; refuse a campaign that asks for another one."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    assert client is not None  # serve.start() just ran
    config = client.http_config
    if (config.host, config.port) != (host, port):
        raise DeployError(
            f"Serve already listens on {config.host}:{config.port}, the campaign asks for "
            f"{host}:{port}: use that address or shut Serve down first"
        )


# Serve's controller says this of replicas Ray has not placed after 30 s (RAY_SERVE_SLOW_STARTUP_WARNING_S).
_UNSCHEDULED = "to be scheduled"


def wait_running(names: Sequence[str], *, deadline: float, autoscaling: bool = False) -> None:
    from ray import serve
    from ray.serve.schema import ApplicationStatus

    while True:
        apps = serve.status().applications
        states = {name: apps[name].status if name in apps else ApplicationStatus.NOT_STARTED for name in names}
        failed = [n for n, s in states.items() if s in (ApplicationStatus.DEPLOY_FAILED, ApplicationStatus.UNHEALTHY)]
        if failed:
            raise DeployError(f"arm {failed[0]} failed to deploy: {_failure(apps[failed[0]])}")
        if all(s == ApplicationStatus.RUNNING for s in states.values()):
            return
        if not autoscaling:
            for name in names:
                stuck = [str(d.message) for d in apps[name].deployments.values()] if name in apps else []
                if any(_UNSCHEDULED in m for m in stuck):
                    message = next(m for m in stuck if _UNSCHEDULED in m).replace("\n", " ")
                    raise DeployError(f"arm {name}: Ray cannot place its replicas: {message[:400]}")
        if time.monotonic() > deadline:
            waiting = [n for n, s in states.items() if s != ApplicationStatus.RUNNING]
            said = _serve_says(apps, waiting)
            raise DeployError(
                f"arms not running before the deadline: {', '.join(waiting)} "
                + (f"(Serve: {said})" if said else "(not enough CPUs/GPUs in the cluster for their resources?)")
            )
        time.sleep(0.5)


def _serve_says(apps: dict[str, Any], names: Sequence[str]) -> str:
    """What Serve's controller last said of the waiting arms' deployments, on one line: why replicas are not up
    yet (slow to initialize, not scheduled), so a deadline names the cause, not a guess."""
    messages = [
        " ".join(str(d.message).split())
        for name in names
        if name in apps
        for d in apps[name].deployments.values()
        if d.message
    ]
    return "; ".join(messages)[:400]


def _failure(app: Any) -> str:
    """The most specific line Serve has: a deployment's message (the replica's exception) over the app's."""
    messages: list[str] = [str(d.message) for d in app.deployments.values() if d.message] + [str(app.message)]
    for message in messages:
        lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
        errors = [line for line in lines if "rror" in line and not line.startswith("For further information")]
        if errors or lines:
            return (errors or lines)[-1][:500]
    return "no message"


def warm_up(url: str, arm: ArmSpec, *, deadline: float) -> dict[str, Any]:
    body = json.dumps({"model": arm.served_model_name, "prompt": "warm up", "max_tokens": 2}).encode()
    last = "no answer"
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            f"{url}/v1/completions", data=body, headers={"content-type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                payload: dict[str, Any] = json.loads(response.read())
                return payload
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            last = str(exc)
            time.sleep(0.5)
    raise DeployError(f"arm {arm.name} did not answer its warm-up request at {url}: {last}")


def teardown_arms(names: Sequence[str]) -> list[str]:
    from ray import serve

    deleted = []
    existing = serve.status().applications
    for name in names:
        if name in existing:
            serve.delete(name, _blocking=True)
            deleted.append(name)
    return deleted


def teardown(campaign: Campaign | None, *, address: str | None = None) -> list[str]:
    """Delete the campaign's arms, or with no campaign every application on this Serve instance."""
    from ray import serve

    connect(address)
    names = list(serve.status().applications) if campaign is None else [arm.app_name for arm in campaign.arms()]
    return teardown_arms(names)
