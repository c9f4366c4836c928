"""A campaign end to end on a multi-node Ray (infra/ray-multinode.sh: head + 2 workers with fake GPUs on
127.0.0.1): GPU arms land on the GPU nodes, load workers spread over nodes, rows == requests."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadshapes.trace import read_traces
from tests.ray_helpers import free_port, is_loopback, listeners, stop

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    temp_dir = tempfile.mkdtemp(prefix="sdmn", dir="/tmp")
    port, dashboard = free_port(), free_port()
    # The script gives every other listener of the three nodes a free port. A token of this cluster's own: nothing
    # depends on ~/.ray/auth_token existing.
    env = {**os.environ, "RAY_PORT": str(port), "RAY_DASHBOARD_PORT": str(dashboard), "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_BIN": str(BIN / "ray"), "PATH": f"{BIN}:{os.environ['PATH']}"}  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    process = subprocess.Popen([str(REPO / "infra" / "ray-multinode.sh"), "2", temp_dir], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert process.stdout is not None
    lines = []
    for line in process.stdout:  # the script prints RAY_ADDRESS once all three nodes are up
        lines.append(line)
        if line.startswith("RAY_ADDRESS="):
            break
    if not (lines and lines[-1].startswith("RAY_ADDRESS=")):
        process.kill()
        stop(temp_dir)
        pytest.fail("infra/ray-multinode.sh did not bring its nodes up:\n" + "".join(lines[-40:]))
    try:
        yield {"env": env, "address": f"http://127.0.0.1:{dashboard}", "gcs": f"127.0.0.1:{port}", "temp_dir": temp_dir}
    finally:
        process.terminate()  # the script's SIGTERM handler shuts the three nodes down
        try:
            process.wait(120)
        finally:
            stop(temp_dir)  # whatever the shutdown left behind, and only this cluster's
            shutil.rmtree(temp_dir, ignore_errors=True)


def _nodes(cluster: dict[str, Any]) -> dict[str, dict[str, float]]:
    script = "import json, ray; ray.init(); print(json.dumps({n['NodeID']: n['Resources'] for n in ray.nodes()}))"
    out = subprocess.run([sys.executable, "-c", script], env={**cluster["env"], "RAY_ADDRESS": cluster["gcs"]},
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    nodes: dict[str, dict[str, float]] = json.loads(out.stdout.strip().splitlines()[-1])
    return nodes


def test_a_campaign_runs_across_nodes(cluster: dict[str, Any], tmp_path: Path) -> None:
    nodes = _nodes(cluster)
    assert len(nodes) == 3
    head = next(n for n, r in nodes.items() if "head" in r)
    gpu_nodes = {n for n, r in nodes.items() if r.get("GPU", 0) >= 1}
    output = tmp_path / "run"
    campaign = {
        "name": "multinode",
        "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "resources": {"cpus_per_engine": 0.5, "gpus_per_engine": 1},
        "shapes": {"quiet": {"kind": "quiet", "rate": 4, "duration_s": 3}},
        "mix": {"entries": [{"workload": "chat", "weight": 1}]},
        "output": str(output),
        "load": {"workers": 2, "cpus_per_worker": 0.5, "drain_s": 20},
        "serve": {"host": "127.0.0.1", "port": free_port()},
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign))
    command = [str(BIN / "ray"), "job", "submit", "--address", cluster["address"], "--working-dir", str(REPO),
               "--", "specdrill", "run", str(path)]  # fmt: skip
    deadline = time.monotonic() + 300  # the job agent can take minutes on a busy 2-core machine
    while True:
        result = subprocess.run(command, env=cluster["env"], capture_output=True, text=True, timeout=600, check=False)
        if "No available agent to submit job" not in result.stderr or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifest = json.loads((output / "manifest.json").read_text())
    # Arms asked for a GPU each: they run on the (fake) GPU nodes, never on the head.
    assert {a["node_id"] for a in manifest["arms"].values()} <= gpu_nodes
    markers = [json.loads(p.read_text()) for p in (output / "units").rglob("*.json")]
    assert len(markers) == 2
    for marker in markers:
        worker_nodes = {w["node_id"] for w in marker["workers"]}
        assert len(worker_nodes) == 2 and worker_nodes <= set(nodes)  # SPREAD: two nodes for two workers
        assert marker["rows"] == marker["scheduled"] > 5
    assert read_traces(str(output / "traces")).num_rows == sum(m["scheduled"] for m in markers)
    assert head not in {a["node_id"] for a in manifest["arms"].values()}


def test_every_listener_of_the_three_nodes_is_on_loopback(cluster: dict[str, Any]) -> None:
    # After the campaign: Serve's proxies and controller are still up on the nodes.
    sockets = listeners(cluster["temp_dir"])
    assert [s for s in sockets if not is_loopback(s[0])] == []
    assert sum(1 for *_, name in sockets if name == "raylet") >= 3  # each node's raylet, on loopback
