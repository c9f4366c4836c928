"""A campaign end to end across three hosts with addresses of their own (tests/netbed.py: a head and two workers
with fake GPUs, each in a network namespace): GPU arms land on the GPU nodes, load workers run on every node,
including nodes that hold no replica, every request answers, rows == requests."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest
import yaml

from loadshapes.trace import read_traces
from tests import REPO
from tests.netbed import BedRay, NetBed, ray_cluster, submit, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


@pytest.fixture(scope="module")
def cluster() -> Iterator[BedRay]:
    with NetBed() as bed, ray_cluster(bed, gpus_per_worker=2) as ray:
        yield ray


def test_a_campaign_runs_across_nodes(cluster: BedRay, tmp_path: Path) -> None:
    nodes = {n["NodeID"]: n for n in cluster.nodes() if n["Alive"]}
    addresses = sorted(h.address for h in cluster.bed.hosts.values())
    assert sorted(n["NodeManagerAddress"] for n in nodes.values()) == addresses  # a node per host, its own address
    head = next(i for i, n in nodes.items() if "head" in n["Resources"])
    gpu_nodes = {i for i, n in nodes.items() if n["Resources"].get("GPU", 0) >= 1}
    output = tmp_path / "run"
    campaign = {
        "name": "multinode",
        "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "resources": {"cpus_per_engine": 0.5, "gpus_per_engine": 1},
        "shapes": {"quiet": {"kind": "quiet", "rate": 4, "duration_s": 3}},
        "mix": {"entries": [{"workload": "chat", "weight": 1}]},
        "output": str(output),
        # Three workers, three nodes (SPREAD): each arm's replica is on one GPU node, so one worker runs on the
        # other GPU node, where no replica is, and one on the head.
        "load": {"workers": 3, "cpus_per_worker": 0.5, "drain_s": 20},
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign))
    result = submit(cluster, ["specdrill", "run", str(path)], working_dir=str(REPO))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifest = json.loads((output / "manifest.json").read_text())
    # Arms asked for a GPU each: they run on the (fake) GPU nodes, never on the head.
    arm_nodes = {a["node_id"] for a in manifest["arms"].values()}
    assert arm_nodes <= gpu_nodes and head not in arm_nodes
    markers = [json.loads(p.read_text()) for p in (output / "units").rglob("*.json")]
    assert len(markers) == 2
    for marker in markers:
        assert {w["node_id"] for w in marker["workers"]} == set(nodes)  # a worker on every node
        assert marker["rows"] == marker["scheduled"] > 5
    traces = read_traces(str(output / "traces"))
    assert traces.num_rows == sum(m["scheduled"] for m in markers)
    failed = traces.filter(pc.not_equal(traces["status"], "ok"))
    assert failed.num_rows == 0, failed.select(["worker", "error_class", "error_message"]).slice(0, 5).to_pylist()
    # The report's serve path per pair of nodes: every worker's node, including those with no replica, to the
    # replicas' nodes, every request counted once.
    paths = json.loads((output / "summary.json").read_text())["serve_paths"]
    assert {p["client_node"] for p in paths} == set(nodes) and {p["server_node"] for p in paths} <= arm_nodes
    assert sum(p["requests"] for p in paths) == traces.num_rows
    assert any(p["client_node"] not in arm_nodes for p in paths)  # sent from a node that holds no replica


def test_the_beds_ray_listens_only_inside_the_bed(cluster: BedRay) -> None:
    bed = cluster.bed
    head = bed.hosts[cluster.head]
    # The dashboard (job submit's address) on the head's own address, reached from the root namespace above.
    assert (head.address, 8265) in bed.listeners(cluster.head)
    # Every host listens only on its namespace's addresses (a wildcard there is lo + the host's eth0).
    for name, host in bed.hosts.items():
        assert {a for a, _ in bed.listeners(name)} <= {host.address, "127.0.0.1", "0.0.0.0", "*", "::",
                                                      f"::ffff:{host.address}", "::ffff:127.0.0.1"}  # fmt: skip
    # ... and no process of the bed listens in the root namespace (this machine's real addresses).
    ours = {pid for name in bed.hosts for pid in bed.pids(name)}
    root = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    assert not [line for line in root.splitlines() if any(f"pid={p}," in line for p in ours)]
