"""vLLM layouts that only a cluster of several nodes shows, on the multi-host test bed (tests/netbed.py: a head
and two workers with two fake GPUs each, every node with its own address): a data-parallel group larger than a
node, placed by vLLM's own Ray DP backend (create_dp_placement_groups, keyed by each node's `node:<ip>`
resource, which a loopback cluster shares between all its nodes)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests import REPO
from tests.netbed import BedRay, NetBed, ray_cluster, submit, unavailable

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


@pytest.fixture(scope="module")
def cluster() -> Iterator[BedRay]:
    with NetBed() as bed, ray_cluster(bed, gpus_per_worker=2) as ray:
        yield ray


def test_a_data_parallel_group_larger_than_a_node_is_placed_by_vllms_ray_dp_backend(
    cluster: BedRay, tmp_path: Path
) -> None:
    nodes = {n["NodeID"]: n for n in cluster.nodes() if n["Alive"]}
    gpu_nodes = {i for i, n in nodes.items() if n["Resources"].get("GPU", 0) >= 1}
    campaign = {
        "name": "raydp",
        # The probe never loads the model: a name is enough, and nothing is downloaded.
        "engine": {"kind": "vllm", "model": "placement-probe/no-weights"},
        "policies": {"off": "off"},
        "topologies": {"dp4": {"kind": "data_parallel", "size": 4}},
        "resources": {"cpus_per_engine": 0.25, "gpus_per_engine": 1},  # gpus_per_node read from the cluster: 2
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign))
    result = submit(cluster, ["specdrill", "deploy", "--check", "--json", str(path)], working_dir=str(REPO))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = result.stdout
    reports = json.loads(text[text.index("{\n") : text.rindex("}") + 1])
    (report,) = reports["off-dp4"]  # one replica: the front end of all four ranks
    assert report["layout"] == "ray_dp" and report["data_parallel_backend"] == "ray"
    assert report["dp_master_ip"] == nodes[report["node_id"]]["NodeManagerAddress"]
    ranks = report["ranks"]
    assert [r["dp_rank"] for r in ranks] == [0, 1, 2, 3]
    # Each rank within one node, its engine core beside its worker; two ranks on each GPU node, four GPUs.
    for rank in ranks:
        (node,) = rank["nodes"]
        assert rank["engine_core"]["node_id"] == node and node in gpu_nodes
    assert Counter(r["nodes"][0] for r in ranks) == {n: 2 for n in gpu_nodes}
    assert len({(w["node_id"], tuple(w["gpu_ids"])) for r in ranks for w in r["workers"]}) == 4
    # The replica's own node holds as many ranks as its free GPUs can (none on the GPU-less head).
    expected_local = 2 if report["node_id"] in gpu_nodes else 0
    assert report["data_parallel_size_local"] == expected_local
