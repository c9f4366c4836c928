"""The infra/ manifests' own start on the network-namespace test bed (tests/netbed.py): each node a "container" on a
bed host, started the way KubeRay or the Ray cluster launcher starts it.

A container here is a PID and mount namespace inside the host's network namespace (`unshare --pid --mount
--mount-proc`), with an init that reaps orphans, and a /tmp of its own (a directory of this machine bound over
/tmp inside; HOME is /tmp/home). So, as in a pod or a launcher's docker container, `ray stop` sees only the node's
own processes (it stops Ray processes by name: on the bare bed it would stop every Ray on this machine), and Ray's
/tmp/ray (session, sockets, ~/.ray) is the node's own. Commands enter a container with `nsenter`, as
`docker exec` / `kubectl exec` do.

What KubeRay does to a pod template is emulated from KubeRay's source (ray-project/kuberay at feeaf72fa, the
commit whose CRDs tests/data/kuberay vendors; ray-operator/controllers/ray/...):
- the `ray start` command: setMissingRayStartParams, generateRayStartCommand, convertParamMap and BuildPod
  (common/pod.go ~1345-1546, ~886-915): `ulimit -n ...; ray start [--head] --block ...` from rayStartParams, with
  num-cpus, memory and num-gpus taken from the container's resource limits when rayStartParams lacks them;
- the container's environment: setContainerEnvVars (pod.go ~1207-1343) and, with `authOptions: {mode: token}`,
  SetContainerTokenAuthEnvVars (pod.go ~387-428): RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the Secret that
  reconcileAuthSecret / createAuthSecret (raycluster_controller.go ~423-486) generate: base64 of 32 random
  bytes, key `auth_token`, the Secret named after the cluster;
- the worker's wait-gcs-ready init container (pod.go ~603-640): `ray health-check` against the head until it
  answers, with the token too (configureTokenAuth, pod.go ~345-362).
The launcher's side is Ray's own code (ray/autoscaler/_private): commands.py ~860-890 and
v2/instance_manager/ray_installer.py ~49-75 (the exports before each start command), updater.py ~512-540
(RAY_OVERRIDE_RESOURCES), command_runner.py ~86-113 (how a command is wrapped).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.netbed import RAY, NetBed

VENV_BIN = str(Path(sys.executable).parent)
# An image's PATH: Ray and Python from the venv in place of the image's.
IMAGE_PATH = f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_RUNS_FROM = (str(Path(__file__).resolve().parent.parent), sys.prefix)  # the checkout and its venv
_UNDER_TMP = [p for p in sorted({p for p in _RUNS_FROM if p.startswith("/tmp/")})
              if not any(p.startswith(f"{q}/") for q in _RUNS_FROM)]  # fmt: skip
CONTAINER_HOME = "/tmp/home"  # the image's /home/ray: inside the container's own /tmp

# The container's PID 1: reaps whatever `ray start` leaves behind when it daemonizes; SIGTERM ends it, and with it
# (the kernel kills a PID namespace whose init exits) every process of the container.
_INIT = """
import os, signal, time
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
"""


@dataclass
class Container:
    bed: NetBed
    host: str
    root: Path  # this machine's directory that is /tmp inside
    init: subprocess.Popen[bytes]
    pid: int  # the container's init, numbered as this machine's PID namespace sees it

    @property
    def address(self) -> str:
        return self.bed.hosts[self.host].address

    def argv(self, script: str) -> list[str]:
        # The working directory is changed inside: nsenter opens --wd before it enters the mount namespace.
        inner = f"cd {CONTAINER_HOME} && {script}"
        return ["nsenter", f"--target={self.pid}", "--pid", "--mount", "--net", "--", "bash", "-c", inner]

    def run(self, script: str, env: Mapping[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(script), env=dict(env), capture_output=True, text=True, timeout=timeout,
                              check=False)  # fmt: skip

    def start(self, script: str, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
        """A long-running command (`ray start --block`), its output appended to `log`."""
        with log.open("ab") as out:
            return subprocess.Popen(self.argv(script), env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)  # fmt: skip

    def path(self, inside: str) -> Path:
        """This machine's path of a path under /tmp (or ~) inside the container."""
        inside = inside.replace("~", CONTAINER_HOME, 1) if inside.startswith("~") else inside
        if not inside.startswith("/tmp/"):
            raise ValueError(f"{inside}: a container here has a writable /tmp only")
        return self.root / inside.removeprefix("/tmp/")


def _child(pid: int, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children and Path(f"/proc/{children[0]}/cmdline").read_bytes().startswith(sys.executable.encode()):
                return int(children[0])
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the container init under unshare {pid} did not start")


@contextmanager
def containers(bed: NetBed) -> Iterator[dict[str, Container]]:
    """One container on every host of the bed; all their processes are killed when it ends (failure included).

    Every host also gets a default route on its own link (to no gateway: the bridge has no way out). A pod has a
    default route, and Ray's head finds its own address by the route to 8.8.8.8 (ray._private.services
    get_node_ip_address; without one it falls back to 127.0.0.1, and the workers could not reach it)."""
    made: dict[str, Container] = {}
    try:
        for name, host in bed.hosts.items():
            subprocess.run(["ip", "-n", host.netns, "route", "add", "default", "dev", "eth0"], check=True,
                           capture_output=True)  # fmt: skip
            root = Path(tempfile.mkdtemp(prefix=f"{bed.prefix}{name}", dir="/tmp"))
            (root / "home").mkdir()
            # What the container runs from (this checkout, its venv) stays visible where it lies under /tmp (a
            # clone in a temporary directory): bound into the container's /tmp before it covers the real one.
            script = (
                'r="$0"; exe="$1"; init="$2"; shift 2; for p in "$@"; do mkdir -p "$r${p#/tmp}" && '
                'mount --bind "$p" "$r${p#/tmp}" || exit 1; done; '
                'mount --rbind "$r" /tmp && exec "$exe" -c "$init"'
            )
            init = subprocess.Popen(
                bed.command(name, ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation",
                                   "private", "--mount-proc", "sh", "-c", script, str(root), sys.executable, _INIT,
                                   *_UNDER_TMP]),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            made[name] = Container(bed, name, root, init, _child(init.pid))
        yield made
    finally:
        for container in made.values():
            with suppress(ProcessLookupError):
                os.kill(container.pid, signal.SIGTERM)
        for container in made.values():
            try:
                container.init.wait(timeout=30)
            except subprocess.TimeoutExpired:
                container.init.kill()
                container.init.wait(timeout=30)
            # A bind into the root still mounted (its namespace outlived its processes) would make rmtree delete
            # the checkout itself: leave such a root in place.
            if not any((container.root / p.removeprefix("/tmp/")).is_dir() and any((container.root / p.removeprefix(
                    "/tmp/")).iterdir()) for p in _UNDER_TMP):  # fmt: skip
                shutil.rmtree(container.root, ignore_errors=True)


def container_env(**extra: str) -> dict[str, str]:
    """An image's environment: nothing of this test process's (no RAY_*), Ray on PATH, HOME in the container."""
    return {"PATH": IMAGE_PATH, "HOME": CONTAINER_HOME, "LANG": "C.UTF-8", **extra}


# --- KubeRay -------------------------------------------------------------------------------------------------------

DEFAULT_GCS_PORT = "6379"  # utils.DefaultGcsServerPort; GetHeadPort reads rayStartParams["port"] first
_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": Decimal("0.001"),
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}  # fmt: skip


def quantity_value(quantity: str | int) -> int:
    """A Kubernetes resource.Quantity's Value(): the amount rounded up to an integer ("500m" CPU -> 1)."""
    text = str(quantity)
    found = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if found is None or (found.group(2) and found.group(2) not in _SUFFIXES):
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    amount = Decimal(found.group(1)) * Decimal(_SUFFIXES.get(found.group(2), 1))
    return int(amount.to_integral_value(rounding="ROUND_CEILING"))


def _is_gpu_resource(key: str) -> bool:  # utils/resources.go IsGPUResourceKey
    return key.endswith("gpu") or re.search(r"nvidia\.com/mig-\d+g\.\d+gb$", key) is not None


def _convert_param_map(params: Mapping[str, str]) -> str:
    # convertParamMap: sorted keys, "true" a bare flag, "false" dropped (but for three flags that take a value).
    takes_a_value = {"log-color", "include-dashboard", "include-log-monitor"}
    flags = []
    for option in sorted(params):
        argument = params[option]
        if argument.lower() in {"true", "false"} and option not in takes_a_value:
            if argument.lower() == "true":
                flags.append(f" --{option} ")
        else:
            flags.append(f" --{option}={argument} ")
    return "".join(flags)


def kuberay_ray_start(group: Mapping[str, Any], node_type: str, *, head_address: str) -> str:
    """The container args KubeRay gives the Ray container of a head or worker group (`head_address` stands in for
    the head Service's DNS name, which workers join; the bed has no DNS)."""
    params = {key: str(value) for key, value in (group.get("rayStartParams") or {}).items()}
    if node_type == "worker":
        params.setdefault("address", f"{head_address}:{DEFAULT_GCS_PORT}")
    else:
        params.setdefault("dashboard-host", "0.0.0.0")
    params.setdefault("metrics-export-port", "8080")
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", "52365")
    container = group["template"]["spec"]["containers"][0]
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    if "num-cpus" not in params:
        cpu = limits.get("cpu") or requests.get("cpu")
        if cpu is not None and quantity_value(cpu) != 0:
            params["num-cpus"] = str(quantity_value(cpu))
    if "memory" not in params and limits.get("memory") is not None:
        params["memory"] = str(quantity_value(limits["memory"]))
    for key in sorted(limits):
        if "num-gpus" not in params and _is_gpu_resource(key) and quantity_value(limits[key]) != 0:
            params["num-gpus"] = str(quantity_value(limits[key]))
    start = f"ray start --head {_convert_param_map(params)}" if node_type == "head" else (
        f"ray start {_convert_param_map(params)}")  # fmt: skip
    command = " ".join(container.get("command") or []) + " ".join(container.get("args") or [])
    generated = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {start}"
    if "ray start" in command:
        return command  # BuildPod keeps a command that starts Ray itself
    return f"{command} && {generated}" if command else generated


def kuberay_secrets(cluster_name: str, spec: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The Secrets KubeRay creates for a cluster: the auth token when authOptions asks for token mode."""
    auth = spec.get("authOptions") or {}
    if auth.get("mode") != "token" or auth.get("enableK8sTokenAuth") or auth.get("secretName"):
        return {}
    return {cluster_name: {"auth_token": base64.b64encode(secrets.token_bytes(32)).decode()}}


def _resolve(env: Sequence[Mapping[str, Any]], secrets_: Mapping[str, Mapping[str, str]],
             fields: Mapping[str, str]) -> dict[str, str]:  # fmt: skip
    """A container's env list as the kubelet resolves it: a missing optional Secret key leaves the variable unset."""
    resolved: dict[str, str] = {}
    for entry in env:
        if "value" in entry:
            resolved[entry["name"]] = str(entry["value"])
            continue
        source = entry.get("valueFrom") or {}
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = secrets_.get(ref["name"], {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise RuntimeError(f"{entry['name']}: Secret {ref['name']} key {ref['key']} missing (CreateContainer"
                                   "ConfigError: the pod does not start)")  # fmt: skip
            if value is not None:
                resolved[entry["name"]] = value
        elif "fieldRef" in source:
            resolved[entry["name"]] = fields[source["fieldRef"]["fieldPath"]]
    return resolved


@dataclass(frozen=True)
class KubeRayPod:
    group: str
    node_type: str  # head | worker
    args: str  # the Ray container's generated command line
    env: dict[str, str]
    init_env: dict[str, str]  # the wait-gcs-ready init container's (workers)


def kuberay_pods(cluster_name: str, spec: Mapping[str, Any], *, head_address: str,
                 secrets_: Mapping[str, Mapping[str, str]]) -> list[KubeRayPod]:  # fmt: skip
    """Every pod of a RayClusterSpec (the head, then each worker group's replicas), as KubeRay builds it."""
    groups = [("headgroup", "head", spec["headGroupSpec"])]
    groups += [(g["groupName"], "worker", g) for g in spec["workerGroupSpecs"] for _ in range(int(g["replicas"]))]
    auth = spec.get("authOptions") or {}
    pods = []
    for index, (group_name, node_type, group) in enumerate(groups):
        container = group["template"]["spec"]["containers"][0]
        pod_name = f"{cluster_name}-{group_name}-{index}"
        fields = {"metadata.labels['ray.io/cluster']": cluster_name, "metadata.namespace": "default",
                  "metadata.name": pod_name, "metadata.labels['ray.io/group']": group_name}  # fmt: skip
        template_env = list(container.get("env") or [])
        if auth.get("mode") == "token":  # SetContainerTokenAuthEnvVars: each only where the template has none
            names = {e["name"] for e in template_env}
            if "RAY_AUTH_MODE" not in names:
                template_env.append({"name": "RAY_AUTH_MODE", "value": "token"})
            if "RAY_AUTH_TOKEN" not in names:
                secret = auth.get("secretName") or cluster_name
                template_env.append({"name": "RAY_AUTH_TOKEN",
                                     "valueFrom": {"secretKeyRef": {"name": secret, "key": "auth_token"}}})  # fmt: skip
        init_env = container_env(**_resolve(template_env, secrets_, fields))
        args = kuberay_ray_start(group, node_type, head_address=head_address)
        ray_address = f"127.0.0.1:{DEFAULT_GCS_PORT}" if node_type == "head" else f"{head_address}:{DEFAULT_GCS_PORT}"
        generated = {"RAY_CLUSTER_NAME": cluster_name, "RAY_CLUSTER_NAMESPACE": "default",
                     "RAY_CLOUD_INSTANCE_ID": pod_name, "RAY_NODE_TYPE_NAME": group_name,
                     "KUBERAY_GEN_RAY_START_CMD": args.split("; ", 1)[-1]}  # fmt: skip
        if node_type == "worker":
            generated |= {"FQ_RAY_IP": head_address, "RAY_IP": head_address}
        env = {**init_env, **generated}
        for name, value in (
            ("RAY_PORT", DEFAULT_GCS_PORT),
            ("RAY_ADDRESS", ray_address),
            ("RAY_USAGE_STATS_KUBERAY_IN_USE", "1"),
            ("RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "1"),
        ):
            env.setdefault(name, value)  # fmt: skip
        if node_type == "head":
            env["RAY_USAGE_STATS_EXTRA_TAGS"] = "kuberay_version=emulated;kuberay_crd=RayCluster"
        pods.append(KubeRayPod(group_name, node_type, args, env, init_env))
    return pods


@dataclass
class PodProcess:
    """A pod's Ray container: its command, restarted when it exits, as the kubelet restarts it (restartPolicy
    Always), at most `restarts` times. On this shared 2-core machine Ray's own startup deadline (a node's raylet
    must register within 30 s, ray/_private/node.py ~427) is sometimes missed; a start that fails every time
    (no token) still fails, with its log."""

    container: Container
    script: str
    env: dict[str, str]
    log: Path
    restarts: int = 3
    started: int = 0
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.started += 1
        with self.log.open("a") as out:
            out.write(f"--- start {self.started}\n")
        self.process = self.container.start(self.script, self.env, self.log)

    def check(self) -> None:
        if self.process is None or self.process.poll() is None:
            return
        if self.started > self.restarts:
            raise RuntimeError(f"{self.container.host}: `ray start` exited {self.process.returncode}, "
                               f"{self.started} times:\n{self.log.read_text(errors='replace')[-3000:]}")  # fmt: skip
        self.start()


def wait_gcs_ready(container: Container, env: Mapping[str, str], head_address: str, head: PodProcess,
                   timeout_s: float = 300) -> None:  # fmt: skip
    """KubeRay's wait-gcs-ready init container: `ray health-check` against the head's GCS until it answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        head.check()
        # `timeout`: while the head's GCS is not up yet, one health check can wait for minutes.
        check = f"timeout 20 ray health-check --address {head_address}:{DEFAULT_GCS_PORT}"
        done = container.run(check, env, timeout=60)
        if done.returncode == 0:
            return
        if time.monotonic() > deadline or "nsenter:" in done.stderr:
            raise RuntimeError(f"the head's GCS did not become ready for {container.host}: {done.stderr[-2000:]}\n"
                               f"head log: {head.log.read_text(errors='replace')[-3000:]}")  # fmt: skip
        time.sleep(2)


# --- the Ray cluster launcher --------------------------------------------------------------------------------------


def launcher_command(command: str, exports: Mapping[str, object]) -> str:
    """One start command as the launcher's command runner runs it (the image's login shell aside): the updater's
    variables exported first (JSON-encoded, shell-quoted), then the command in a subshell."""
    prefix = "".join(f"export {key}={shlex.quote(json.dumps(value, separators=(',', ':')))};"
                     for key, value in exports.items())  # fmt: skip
    return f"export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore && ({prefix}{command})"


# --- the operator's side (this machine's namespace) ------------------------------------------------------------------


def ray_cli(args: Sequence[str], env: Mapping[str, str], timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """`ray ...` from the root namespace; retried while the head's job agent is not up yet."""
    deadline = time.monotonic() + 240
    while True:
        done = subprocess.run([RAY, *args], env=dict(env), capture_output=True, text=True, timeout=timeout_s,
                              check=False)  # fmt: skip
        if "No available agent to submit job" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(3)


def _bearer(env: Mapping[str, str]) -> dict[str, str]:
    """The header `ray` sends with the client's token: RAY_AUTH_TOKEN, else ~/.ray/auth_token (token mode)."""
    if env.get("RAY_AUTH_MODE") != "token":
        return {}
    token = env.get("RAY_AUTH_TOKEN") or (Path(env["HOME"]) / ".ray" / "auth_token").read_text().strip()
    return {"Authorization": f"Bearer {token}"}


def alive_nodes(dashboard: str, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The alive nodes, from the dashboard's state API (what `ray list nodes` asks, without a `ray` process's
    seconds of start-up on each poll), with the client's token."""
    request = urllib.request.Request(f"{dashboard}/api/v0/nodes?limit=100", headers=_bearer(env))
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            nodes: list[dict[str, Any]] = json.loads(response.read())["data"]["result"]["result"]
    except (OSError, ValueError, KeyError):  # not up yet (refused, 5xx, a partial answer)
        return []
    return [n for n in nodes if n.get("state") == "ALIVE"]


def wait_for_nodes(dashboard: str, env: Mapping[str, str], count: int, pods: Sequence[PodProcess] = (),
                   timeout_s: float = 300) -> list[dict[str, Any]]:  # fmt: skip
    """The alive nodes once `count` are up (or the deadline passed); the pods' containers restarted meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        for pod in pods:
            pod.check()
        nodes = alive_nodes(dashboard, env)
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(1)
