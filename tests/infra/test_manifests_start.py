"""The infra/ manifests start a Ray cluster that takes jobs with its token and refuses them without: the RayCluster,
the RayJob's cluster and the cluster launcher's nodes, each node in a network namespace of its own on the test bed
(tests/netbed.py) and in a container of its own there (tests/podbed.py), started with the start command and the
environment the file gives, as KubeRay or the launcher builds them from it.

What cannot run here is replaced by the least that lets the rest run, and only that:
- no images and no Kubernetes: the venv's Ray stands in for the image's, a PID + mount namespace for the
  container; the pods' volumes are not mounted (nothing here reads models or writes results), resource limits
  are not enforced (but they make the `ray start` flags, as KubeRay reads them);
- the head Service's DNS name (the workers' `--address` and RAY_ADDRESS) is the head's address: the bed has no DNS;
- a default route on each host's own link (Ray's head finds its address by it, as in a pod), to no gateway;
- GPUs are Ray's numbers only (`--num-gpus` from the `nvidia.com/gpu` limit, the launcher's resources);
- the launcher: its SSH and docker steps, its initialization commands (they act on the EC2 host: the model cache
  and the results' EFS mount) and the AWS provider are not run; ~/ray_bootstrap_config.yaml (which the launcher
  writes on the head for its autoscaler) is the file's config with the read-only provider, which starts no
  instance; `ray dashboard`'s SSH tunnel to the head's loopback is tests/tcp_forward.py on the head;
- the RayJob: its entrypoint (`specdrill models pull` and `run` on the GPU campaign) needs GPUs and models, so
  the job submitted is a probe of the cluster; it is submitted with the RayJob's runtimeEnvYAML, as KubeRay's
  submitter does (common/job.go BuildJobSubmitCommand).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import REPO, TESTS
from tests.netbed import DASHBOARD_PORT, NetBed, ray_env, unavailable
from tests.podbed import (
    Container,
    PodProcess,
    container_env,
    containers,
    kuberay_pods,
    kuberay_secrets,
    launcher_command,
    ray_cli,
    wait_for_nodes,
    wait_gcs_ready,
)

INFRA = REPO / "infra"

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]  # fmt: skip

# The job: a driver on the head that connects to its cluster (with the node's token) and counts the nodes.
PROBE = ("import os, ray; ray.init(); print('alive nodes:', sum(n['Alive'] for n in ray.nodes()), "
         "'SPECDRILL_LOG_FORMAT=' + os.environ.get('SPECDRILL_LOG_FORMAT', ''))")  # fmt: skip


@pytest.fixture
def operator_home() -> Iterator[Path]:
    """The operator's HOME on this machine's side: no ~/.ray/auth_token of anyone else's."""
    home = Path(tempfile.mkdtemp(prefix="sdnb-operator"))
    yield home
    subprocess.run(["rm", "-rf", str(home)], check=False)


def _client(home: Path, token: str | None) -> dict[str, str]:
    """`ray` on the operator's side: with the cluster's token, or with none (a HOME without ~/.ray/auth_token)."""
    if token is None:
        home = home / "stranger"
        home.mkdir(exist_ok=True)
    return {**ray_env(token), "HOME": str(home)}


def _submit(dashboard: str, env: Mapping[str, str], runtime_env: Mapping[str, Any] | None = None,
            ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    extra = ["--runtime-env-json", json.dumps(runtime_env)] if runtime_env else []
    return ray_cli(["job", "submit", "--address", dashboard, *extra, "--", sys.executable, "-c", PROBE], env)


def _refused(done: subprocess.CompletedProcess[str], why: str) -> bool:
    return done.returncode != 0 and why in done.stdout + done.stderr


def _check_jobs(dashboard: str, with_token: Mapping[str, str], operator_home: Path, nodes: int,
                runtime_env: Mapping[str, Any] | None = None) -> None:  # fmt: skip
    """A job submitted with the cluster's token runs on it; without a token, or with another, it is refused."""
    done = _submit(dashboard, with_token, runtime_env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"alive nodes: {nodes}" in done.stdout
    for key, value in ((runtime_env or {}).get("env_vars") or {}).items():
        assert f"{key}={value}" in done.stdout
    # The dashboard's answers (ray/_private/authentication/http_token_authentication.py ~72-77). One after another:
    # submitted at once with the job, the three `ray` processes and the job's driver shared the two cores and all
    # took longer (19 s, not 14).
    for token, why in ((None, "Unauthorized: Missing authentication token"),
                       (secrets.token_hex(32), "Forbidden: Invalid authentication token")):  # fmt: skip
        refused = _submit(dashboard, _client(operator_home, token), runtime_env)
        assert _refused(refused, why), refused.stdout[-2000:] + refused.stderr[-2000:]
        assert "alive nodes" not in refused.stdout


def _resources(nodes: list[dict[str, Any]]) -> list[dict[str, float]]:
    return sorted(({k: v for k, v in n["resources_total"].items() if k in {"CPU", "GPU"}} for n in nodes),
                  key=lambda r: (r.get("GPU", 0), r["CPU"]))  # fmt: skip


def _flag(args: str, name: str) -> float:
    return float(args.split(f"--{name}=")[1].split()[0])


def _start_kuberay(spec: dict[str, Any], cluster_name: str, operator_home: Path, tmp_path: Path,
                   runtime_env: Mapping[str, Any] | None = None) -> None:  # fmt: skip
    """Start the cluster of a RayClusterSpec on the bed, as KubeRay would, and check what the manifests promise."""
    pods_count = 1 + sum(int(g["replicas"]) for g in spec["workerGroupSpecs"])
    names = ["head", *(f"worker{i}" for i in range(1, pods_count))]
    secrets_ = kuberay_secrets(cluster_name, spec)
    with NetBed(names=names) as bed, containers(bed) as nodes:
        head = nodes["head"]
        pods = kuberay_pods(cluster_name, spec, head_address=head.address, secrets_=secrets_)
        running = [PodProcess(nodes[name], pod.args, pod.env, tmp_path / f"{name}.log")
                   for name, pod in zip(names, pods, strict=True)]  # fmt: skip
        token = secrets_[cluster_name]["auth_token"] if secrets_ else None
        dashboard, operator = f"http://{head.address}:{DASHBOARD_PORT}", _client(operator_home, token)
        # Pods start in any order on Kubernetes; here one after another (each once the one before is a node), so
        # that no two Ray starts share this machine's two cores.
        running[0].start()
        for k, (name, pod, process) in enumerate(zip(names[1:], pods[1:], running[1:], strict=True), start=1):
            wait_for_nodes(dashboard, operator, k, running[:k])
            wait_gcs_ready(nodes[name], pod.init_env, head.address, running[0])
            process.start()
        up = wait_for_nodes(dashboard, operator, len(names), running)
        assert len(up) == len(names)
        assert sorted(n["node_ip"] for n in up) == sorted(c.address for c in nodes.values())
        # The head takes no GPU; each GPU pod's Ray has its container's nvidia.com/gpu limit.
        expected = [{"CPU": _flag(pods[0].args, "num-cpus")}]
        expected += [{"CPU": _flag(p.args, "num-cpus"), "GPU": _flag(p.args, "num-gpus")} for p in pods[1:]]
        assert _resources(up) == sorted(expected, key=lambda r: (r.get("GPU", 0), r["CPU"]))
        _check_jobs(dashboard, operator, operator_home, len(names), runtime_env)


def test_the_rayclusters_pods_start_and_take_jobs_only_with_kuberays_token(operator_home: Path,
                                                                            tmp_path: Path) -> None:  # fmt: skip
    doc = yaml.safe_load((INFRA / "kuberay" / "raycluster.yaml").read_text())
    _start_kuberay(doc["spec"], doc["metadata"]["name"], operator_home, tmp_path)


def test_the_rayjobs_cluster_starts_and_takes_its_job_only_with_kuberays_token(operator_home: Path,
                                                                               tmp_path: Path) -> None:  # fmt: skip
    doc = yaml.safe_load((INFRA / "kuberay" / "rayjob.yaml").read_text())
    # KubeRay names a RayJob's cluster after the job plus a random suffix (utils.GenerateRayClusterName).
    runtime_env = yaml.safe_load(doc["spec"]["runtimeEnvYAML"])
    _start_kuberay(doc["spec"]["rayClusterSpec"], f"{doc['metadata']['name']}-x7k2q", operator_home, tmp_path,
                   runtime_env)  # fmt: skip


def _launcher_files(config: dict[str, Any], head: Container, workers: list[Container], operator_home: Path) -> None:
    """What `ray up` puts on the nodes before the start commands: file_mounts on every node (local ~ is the
    operator's HOME), and on the head ~/ray_bootstrap_config.yaml, the config its autoscaler reads."""
    for remote, local in (config.get("file_mounts") or {}).items():
        source = Path(local.replace("~", str(operator_home), 1) if local.startswith("~") else local)
        for node in (head, *workers):
            target = node.path(remote)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    from ray.autoscaler._private.util import prepare_config

    bootstrap = prepare_config(config)
    bootstrap["provider"] = {"type": "readonly"}
    head.path("~/ray_bootstrap_config.yaml").write_text(yaml.safe_dump(bootstrap))


def _start_node(node: Container, commands: list[str], exports: dict[str, object], env: dict[str, str]) -> None:
    """A node's start commands in order, as the launcher's updater runs them. Rerun from the first (`ray stop`
    makes them rerunnable, as running `ray up` again does) only when Ray gave up waiting for its own raylet
    (ray/_private/node.py: 30 s), which happens on this shared 2-core machine; at most three times."""
    for attempt in range(3):
        for command in commands:
            done = node.run(launcher_command(command, exports), env)
            if done.returncode != 0:
                break
        else:
            return
        if "timed out during startup" not in done.stderr or attempt == 2:
            raise AssertionError(f"{node.host}: {command}: {done.stdout[-2000:]}{done.stderr[-3000:]}")


def test_the_launchers_nodes_start_with_the_token_it_mounts_and_take_jobs_only_with_it(operator_home: Path) -> None:
    from ray.autoscaler._private.util import with_envs

    config = yaml.safe_load((INFRA / "cluster-launcher.yaml").read_text())
    head_type = config["head_node_type"]
    (worker_type,) = [t for t in config["available_node_types"] if t != head_type]
    worker_spec = config["available_node_types"][worker_type]
    names = ["head", *(f"{worker_type}{i}" for i in range(1, int(worker_spec["min_workers"]) + 1))]
    # The operator's step before `ray up` (the file's header), on this machine's side.
    made = ray_cli(["get-auth-token", "--generate"], {**ray_env(None), "HOME": str(operator_home)})
    assert made.returncode == 0, made.stderr
    with NetBed(names=names) as bed, containers(bed) as nodes:
        head, workers = nodes["head"], [nodes[n] for n in names[1:]]
        _launcher_files(config, head, workers, operator_home)
        node_env = container_env()
        # The head: commands.py (get_or_create_head_node) exports these before each head start command, the
        # updater adds the usage-stats switch and the node type's resources.
        head_resources = config["available_node_types"][head_type]["resources"]
        head_exports: dict[str, object] = {"RAY_USAGE_STATS_ENABLED": 0, "RAY_OVERRIDE_RESOURCES": head_resources}
        head_commands = with_envs(config["head_start_ray_commands"],
                                  {"RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": "i-head",
                                   "RAY_NODE_TYPE_NAME": head_type})  # fmt: skip
        _start_node(head, head_commands, head_exports, node_env)
        # `ray dashboard`'s tunnel: the operator reaches the dashboard on the head's loopback through it.
        tunnel = subprocess.Popen(bed.command("head", [sys.executable, str(TESTS / "tcp_forward.py"),
                                                       head.address, str(DASHBOARD_PORT), "127.0.0.1",
                                                       str(DASHBOARD_PORT)]))  # fmt: skip
        try:
            instance_type = worker_spec["node_config"]["InstanceType"]
            for i, worker in enumerate(workers):
                # ray_installer.py: the exports of a worker the head's autoscaler starts (RAY_HEAD_IP included).
                worker_commands = with_envs(config["worker_start_ray_commands"],
                                            {"RAY_HEAD_IP": head.address, "RAY_CLOUD_INSTANCE_ID": f"i-worker{i}",
                                             "RAY_NODE_TYPE_NAME": worker_type,
                                             "RAY_CLOUD_INSTANCE_TYPE_NAME": instance_type})  # fmt: skip
                _start_node(worker, worker_commands, {"RAY_OVERRIDE_RESOURCES": worker_spec["resources"]}, node_env)
            dashboard = f"http://{head.address}:{DASHBOARD_PORT}"
            operator = {**ray_env(None), "RAY_AUTH_MODE": "token", "HOME": str(operator_home)}
            up = wait_for_nodes(dashboard, operator, len(names))
            assert len(up) == len(names)
            assert sorted(n["node_ip"] for n in up) == sorted(c.address for c in nodes.values())
            expected = [head_resources] + [worker_spec["resources"]] * len(workers)
            assert _resources(up) == sorted(({k: float(v) for k, v in r.items()} for r in expected),
                                            key=lambda r: (r.get("GPU", 0), r["CPU"]))  # fmt: skip
            # The dashboard itself listens on the head's loopback only: the tunnel is the way in.
            assert ("127.0.0.1", DASHBOARD_PORT) in bed.listeners("head")
            _check_jobs(dashboard, operator, operator_home, len(names))
        finally:
            tunnel.terminate()
            tunnel.wait(timeout=30)
