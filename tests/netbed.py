"""A multi-host test bed on one machine: every host in a Linux network namespace of its own, with an address that
exists only inside the bed, so that what depends on a node having its own address (Serve's proxies, job submit
from outside the head) is seen as on a real cluster.

Layout (a /24 of 10.213.0.0/16 that this machine does not use, picked per bed):

    namespace <prefix>-br     bridge br0, one port per host and one for the client
    namespace <prefix>-<host> lo + eth0 at 10.213.N.(i+1)/24; no default route, no route off the machine
    root namespace            veth <prefix>c at 10.213.N.254/24: the operator's laptop

The test process stays in the root namespace and reaches the hosts only through that veth, the way an operator's
laptop reaches a cluster over a routed network (VPN, port-forward) with its own tools (`ray job submit`, urllib)
unchanged; nothing of the bed is reachable from anywhere else, and the hosts have no route beyond the /24.

Everything is removed at the end, also after a failure: `NetBed.down()` stops every process left in a host's
namespace (`ip netns pids`, by PID), then deletes the namespaces (their veths go with them). `sweep()` removes
what an earlier bed left behind when its process died: names carry the creating process's PID.

`ray_cluster(bed, ...)` starts a Ray head and workers on the bed's hosts (token auth, fake GPUs) as `ray start`
runs them on real nodes. Needs root and iproute2: `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "sdnb"  # every name of every bed starts with it, then the PID of the process that made the bed
_SUBNET = "10.213"
_COUNTER = itertools.count()
RAY = str(Path(sys.executable).parent / "ray")


def unavailable() -> str | None:
    """Why a bed cannot be made here (for pytest.skip), or None."""
    if os.geteuid() != 0:
        return "the network-namespace test bed needs root (ip netns add)"
    if shutil.which("ip") is None:
        return "the network-namespace test bed needs `ip` (iproute2)"
    probe = f"{PREFIX}{os.getpid()}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _netns_list() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _pids_in(netns: str) -> list[int]:
    done = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def _is_gcs(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return os.path.basename(argv0) == b"gcs_server"


def _stop_pids(pids: Sequence[int], grace_s: float = 10.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.2)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process counts as gone
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _remove_netns(netns: str) -> None:
    # Processes first: a namespace with processes in it outlives `ip netns del` (only its name goes).
    for _ in range(3):
        pids = _pids_in(netns)
        if not pids:
            break
        _stop_pids(pids)
    _ip("netns", "del", netns, check=False)


def sweep() -> list[str]:
    """Remove the namespaces and root-namespace links of beds whose process is gone; returns their names."""
    owner = re.compile(rf"^{PREFIX}(\d+)")
    removed = []
    for netns in _netns_list():
        found = owner.match(netns)
        if found and not _alive(int(found.group(1))):
            _remove_netns(netns)
            removed.append(netns)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        found = owner.match(name)
        if found and not _alive(int(found.group(1))):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _subnet_in_use(third: int) -> bool:
    used = _ip("-4", "addr").stdout + _ip("-4", "route").stdout
    return f"{_SUBNET}.{third}." in used


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    address: str


@dataclass
class NetBed:
    """Hosts on one bridge, each in its own network namespace. Use as a context manager (or up() / down())."""

    names: Sequence[str] = ("head", "worker1", "worker2")
    prefix: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}{chr(97 + next(_COUNTER) % 26)}")
    hosts: dict[str, Host] = field(default_factory=dict)
    client_address: str = ""
    subnet: str = ""

    def __enter__(self) -> NetBed:
        self.up()
        return self

    def __exit__(self, *_: object) -> None:
        self.down()

    @property
    def bridge_netns(self) -> str:
        return f"{self.prefix}-br"

    def up(self) -> None:
        sweep()
        try:
            self._create()
        except BaseException:
            self.down()
            raise

    def _create(self) -> None:
        third = next(t for t in random.sample(range(1, 255), 254) if not _subnet_in_use(t))
        self.subnet = f"{_SUBNET}.{third}.0/24"
        br = self.bridge_netns
        _ip("netns", "add", br)
        _ip("-n", br, "link", "set", "lo", "up")
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _ip("-n", br, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            netns, address = f"{self.prefix}-{name}", f"{_SUBNET}.{third}.{i + 1}"
            inner, outer = f"{self.prefix}{i}a", f"{self.prefix}{i}b"
            _ip("netns", "add", netns)
            self.hosts[name] = Host(name, netns, address)
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", netns)
            _ip("link", "set", outer, "netns", br)
            _ip("-n", netns, "link", "set", inner, "name", "eth0")
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("-n", br, "link", "set", outer, "master", "br0", "up")
        # The operator's side: a veth from the root namespace to the bridge, an address on the bed's /24 only.
        client, port = f"{self.prefix}c", f"{self.prefix}cb"
        _ip("link", "add", client, "type", "veth", "peer", "name", port)
        _ip("link", "set", port, "netns", br)
        _ip("-n", br, "link", "set", port, "master", "br0", "up")
        self.client_address = f"{_SUBNET}.{third}.254"
        _ip("addr", "add", f"{self.client_address}/24", "dev", client)
        _ip("link", "set", client, "up")

    def down(self) -> None:
        for host in self.hosts.values():
            _remove_netns(host.netns)
        _remove_netns(self.bridge_netns)
        _ip("link", "del", f"{self.prefix}c", check=False)  # gone with its peer already, unless creation broke
        self.hosts.clear()

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run on `host` (inside its network namespace)."""
        return ["ip", "netns", "exec", self.hosts[host].netns, *argv]

    def run(self, host: str, argv: Sequence[str], *, env: Mapping[str, str], timeout: float = 180,
            check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
        done = subprocess.run(self.command(host, argv), env=dict(env), capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"on {host}: {' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        return done

    def listeners(self, host: str) -> list[tuple[str, int]]:
        """(address, port) of every listening TCP socket in the host's namespace."""
        out = subprocess.run(self.command(host, ["ss", "-ltnH"]), capture_output=True, text=True, check=True).stdout
        found = []
        for line in out.splitlines():
            local = line.split()[3]
            address, _, port = local.rpartition(":")
            found.append((address.strip("[]").split("%")[0], int(port)))
        return found

    def pids(self, host: str) -> list[int]:
        return _pids_in(self.hosts[host].netns)


def ray_env(token: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every node and client of a bed's Ray: token auth with `token`, none without one."""
    env = {**(os.environ if base is None else base), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(name, None)  # =0 makes `ray start --address` refuse to join on Linux ("not supported")
    if token is None:
        env["RAY_AUTH_MODE"] = "disabled"
    else:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    return env


@dataclass(frozen=True)
class BedRay:
    bed: NetBed
    env: dict[str, str]  # for `ray` / `specdrill` clients: the token, no RAY_ADDRESS
    address: str  # the dashboard's http URL, on the head's address
    gcs: str
    head: str  # the head's host name
    temp_dirs: dict[str, str]

    def nodes(self) -> list[dict[str, Any]]:
        """ray.nodes() as a driver on the head sees them."""
        import json

        script = "import json, ray; ray.init(); print(json.dumps(ray.nodes()))"
        out = self.bed.run(self.head, [sys.executable, "-c", script], env={**self.env, "RAY_ADDRESS": self.gcs},
                           timeout=120)  # fmt: skip
        nodes: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
        return nodes


GCS_PORT, DASHBOARD_PORT = 6379, 8265  # Ray's own defaults: every host has its own ports


def head_command(address: str, temp_dir: str, *, num_cpus: int, extra: Sequence[str] = ()) -> list[str]:
    return [RAY, "start", "--head", f"--node-ip-address={address}", f"--port={GCS_PORT}",
            f"--dashboard-host={address}", f"--dashboard-port={DASHBOARD_PORT}", f"--num-cpus={num_cpus}",
            f"--temp-dir={temp_dir}", "--disable-usage-stats", *extra]  # fmt: skip


def worker_command(head: str, address: str, temp_dir: str, *, num_cpus: int, num_gpus: int,
                   extra: Sequence[str] = ()) -> list[str]:  # fmt: skip
    return [RAY, "start", f"--address={head}:{GCS_PORT}", f"--node-ip-address={address}", f"--num-cpus={num_cpus}",
            f"--num-gpus={num_gpus}", f"--temp-dir={temp_dir}", "--disable-usage-stats", *extra]  # fmt: skip


def wait_nodes(ray: BedRay, count: int, timeout_s: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(1)


@contextmanager
def ray_cluster(bed: NetBed, *, gpus_per_worker: int = 2, num_cpus: int = 4,
                token: str | None = None) -> Iterator[BedRay]:  # fmt: skip
    """A Ray head on the bed's first host and a worker on each other host (fake GPUs: --num-gpus), token auth with
    a token of this cluster's own. Every node stops (by PID, namespace by namespace) when it ends."""
    env = ray_env(token or secrets.token_hex(32))
    names = list(bed.hosts)
    head = bed.hosts[names[0]]
    temp_dirs = {name: tempfile.mkdtemp(prefix=f"{bed.prefix}{name[:1]}", dir="/tmp") for name in names}
    ray = BedRay(bed, env, f"http://{head.address}:{DASHBOARD_PORT}", f"{head.address}:{GCS_PORT}", names[0],
                 temp_dirs)  # fmt: skip
    try:
        bed.run(head.name, [*head_command(head.address, temp_dirs[head.name], num_cpus=num_cpus),
                            "--resources", '{"head": 1}'], env=env)  # fmt: skip
        for name in names[1:]:
            bed.run(name, worker_command(head.address, bed.hosts[name].address, temp_dirs[name], num_cpus=num_cpus,
                                         num_gpus=gpus_per_worker), env=env)  # fmt: skip
        nodes = wait_nodes(ray, len(names))
        if len(nodes) < len(names):
            raise RuntimeError(f"{len(nodes)} of {len(names)} Ray nodes came up on the bed")
        yield ray
    finally:
        for name in reversed(names):  # the head last, and on it the GCS last (see tools.localray.stop)
            if name in bed.hosts:
                pids = bed.pids(name)
                gcs = [pid for pid in pids if _is_gcs(pid)]
                _stop_pids([pid for pid in pids if pid not in gcs])
                _stop_pids(gcs)
        for directory in temp_dirs.values():
            shutil.rmtree(directory, ignore_errors=True)


def submit(ray: BedRay, entrypoint: Sequence[str], *, working_dir: str, env: Mapping[str, str] | None = None,
           timeout_s: float = 600) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`ray job submit` from the root namespace (the operator's side) to the head's dashboard; retried while the
    head's job agent is not up yet (minutes on a busy 2-core machine)."""
    command = [RAY, "job", "submit", "--address", ray.address, "--working-dir", working_dir, "--", *entrypoint]
    deadline = time.monotonic() + 300
    while True:
        result = subprocess.run(command, env=dict(env or ray.env), capture_output=True, text=True, timeout=timeout_s,
                                check=False)  # fmt: skip
        if "No available agent to submit job" not in result.stderr or time.monotonic() > deadline:
            return result
        time.sleep(3)
