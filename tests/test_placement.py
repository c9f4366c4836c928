"""GPU placement of arms, proven on a Ray cluster of several nodes on this machine with declared fake GPUs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from orchestrator.campaign import Campaign
from orchestrator.deploy import deploy
from tests.ray_helpers import free_port

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[dict[str, Any]]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "num_gpus": 0, "include_dashboard": False},
    )
    workers = [cluster.add_node(num_cpus=2, num_gpus=1, resources={f"gpu_node_{i}": 1}) for i in range(2)]
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
    from orchestrator.deploy import teardown

    campaigns: list[Campaign] = []
    yield campaigns
    for campaign in campaigns:
        teardown(campaign)  # free the fake GPUs for the next test


def _campaign(name: str, topology: str, port: int, **resources: Any) -> Campaign:
    return Campaign.model_validate(
        {
            "name": name,
            "engine": {"kind": "simulated", "time_scale": 2.0},
            "policies": {"fixed3": "fixed:3"},
            "topologies": {"t": topology},
            "resources": {"cpus_per_engine": 0.5, **resources},
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
    campaign = _campaign("spread", "replicas:2", gpu_cluster["port"], gpus_per_engine=1, max_engines_per_node=1)
    deployed.append(campaign)
    urls = deploy(campaign, timeout_s=60)
    nodes = _nodes(urls["fixed3-t"], 16)
    assert nodes == gpu_cluster["gpu_nodes"]  # one engine on each fake-GPU node, none on the GPU-less head


def test_a_tensor_parallel_engine_gets_a_placement_group_across_gpu_nodes(
    gpu_cluster: dict[str, Any], deployed: list[Campaign]
) -> None:
    from ray.util import placement_group_table

    campaign = Campaign.model_validate(
        {
            **_campaign("tp", "single", gpu_cluster["port"]).model_dump(by_alias=True),
            "topologies": {"t": {"kind": "single", "tensor_parallel_size": 2}},
            "resources": {"cpus_per_engine": 0.5, "gpus_per_engine": 1, "placement_strategy": "STRICT_SPREAD"},
        }
    )
    before = set(placement_group_table())
    deployed.append(campaign)
    urls = deploy(campaign, timeout_s=60)
    assert _nodes(urls["fixed3-t"], 2) <= gpu_cluster["gpu_nodes"]
    new = [g for pg_id, g in placement_group_table().items() if pg_id not in before and g["state"] == "CREATED"]
    assert len(new) == 1
    group = new[0]
    assert group["strategy"] == "STRICT_SPREAD"
    assert [b.get("GPU") for b in group["bundles"].values()] == [1, 1]
    assert set(group["bundles_to_node_id"].values()) == gpu_cluster["gpu_nodes"]


def test_an_arm_needing_more_gpus_than_exist_is_refused(gpu_cluster: dict[str, Any]) -> None:
    from ray import serve

    from orchestrator.deploy import DeployError

    with pytest.raises(DeployError, match="not running before the deadline"):
        deploy(
            _campaign("toomany", "replicas:3", gpu_cluster["port"], gpus_per_engine=1, max_engines_per_node=1),
            timeout_s=10,
        )
    assert not [n for n in serve.status().applications if n.startswith("toomany.")]
