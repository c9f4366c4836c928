"""Deploy a campaign's arms on Ray Serve, wait until each answers, tear them down again.

All or nothing: if any arm fails to come up or to answer its warm-up request, every arm this call deployed is
deleted before the error is raised.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from orchestrator.campaign import Campaign
from orchestrator.logs import get_logger
from serve_apps.arms import ArmSpec, EndpointEngineConfig, VllmEngineConfig

log = get_logger(__name__)

# Keep every Ray listener on loopback (see README, "Ray on one machine").
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


class DeployError(RuntimeError):
    pass


def connect(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=target, namespace="specdrill", logging_level=logging.ERROR, log_to_driver=False)
    except ConnectionError as exc:
        raise DeployError(
            f"no Ray cluster at {target!r}: start one (infra/ray-up.sh or `ray start --head`) or set RAY_ADDRESS"
            f" ({exc})".replace("\n", " ")
        ) from None


def base_url(campaign: Campaign, arm: ArmSpec) -> str:
    return f"http://{campaign.serve.host}:{campaign.serve.port}{arm.route_prefix}"


def deploy(
    campaign: Campaign,
    *,
    address: str | None = None,
    timeout_s: float | None = None,
    only: Sequence[str] | None = None,
) -> dict[str, str]:
    """Deploy the campaign's arms (or only the named ones) and return {arm name: base URL}."""
    from ray import serve

    from serve_apps.deployment import build_arm_app

    arms = [arm for arm in campaign.arms() if only is None or arm.name in only]
    if isinstance(campaign.engine, EndpointEngineConfig):
        raise DeployError("engine kind endpoint: the servers run elsewhere; there is nothing to deploy")
    connect(address)
    serve.start(http_options={"host": campaign.serve.host, "port": campaign.serve.port})
    _check_listening(campaign)
    timeout = timeout_s or (900.0 if isinstance(campaign.engine, VllmEngineConfig) else 180.0)
    names = [arm.app_name for arm in arms]
    try:
        serve.run_many(
            [
                serve.RunTarget(
                    build_arm_app(arm, campaign.serve.host), name=arm.app_name, route_prefix=arm.route_prefix
                )
                for arm in arms
            ],
            wait_for_applications_running=False,
        )
        _wait_running(names, deadline=time.monotonic() + timeout)
        urls = {arm.name: base_url(campaign, arm) for arm in arms}
        for arm in arms:
            warm_up(urls[arm.name], arm, deadline=time.monotonic() + timeout)
    except BaseException:
        teardown_arms(names)
        raise
    log.info("deploy.done", apps=names)
    return urls


def _check_listening(campaign: Campaign) -> None:
    """Serve keeps the HTTP address it started with; refuse a campaign that asks for another one."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    assert client is not None  # serve.start() just ran
    config = client.http_config
    if (config.host, config.port) != (campaign.serve.host, campaign.serve.port):
        raise DeployError(
            f"Serve already listens on {config.host}:{config.port}, the campaign asks for "
            f"{campaign.serve.host}:{campaign.serve.port}: use that address or shut Serve down first"
        )


def _wait_running(names: Sequence[str], *, deadline: float) -> None:
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
        if time.monotonic() > deadline:
            waiting = [n for n, s in states.items() if s != ApplicationStatus.RUNNING]
            raise DeployError(
                f"arms not running before the deadline: {', '.join(waiting)} "
                "(not enough CPUs/GPUs in the cluster for their resources?)"
            )
        time.sleep(0.5)


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
