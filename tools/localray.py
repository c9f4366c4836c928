"""A Ray on this machine that shares it with other Rays: a free port for every listener, stopped by its own PIDs.

Ray's defaults collide as soon as two Rays run on one machine: `ray start` takes 6379 (GCS), 8265 (dashboard),
10001 (client server), 52365 (dashboard agent HTTP) and workers in 10002-19999; `ray.init` and Cluster heads take
8265 and 52365 too. A head whose agent finds 52365 taken starts but never serves jobs. And `ray stop` kills every
Ray on the machine, including other people's. This module is the one place that picks ports (`RayPorts`) and
stops a Ray by the processes of its temp dir (`stop`); the test helpers and the infra scripts use it.

    python -m tools.localray ports     # RAY_*_PORT=... lines for a shell: one free port per listener
    python -m tools.localray stop DIR  # stop the Ray whose temp dir is DIR, nothing else
    python -m tools.localray wait-job-agent DIR DASHBOARD_PORT AGENT_PORT TIMEOUT_S
    python -m tools.localray held DIR  # which of the RAY_*_PORT ports something else listens on
"""

from __future__ import annotations

import os
import random
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

# Ports outside the kernel's ephemeral range cannot be taken in the meantime by an outgoing connection or by a
# process that binds port 0 (every Ray component that self-binds does). Above 19999: Ray's default worker ports.
_LOW = 20000
# SPECDRILL_PORT_SLICE=i/n: this process and its children pick only ports p with p % n == i. A port is picked,
# then bound seconds later by the server it is for (a Serve proxy, a vLLM server); n processes that pick at once
# (the test suite's workers) could pick the same free port in that gap, and one server then fails to bind
# (the 2026-12-06 CI run: a Serve proxy on 127.0.0.1:30514, three tests failed). Disjoint slices cannot.
PORT_SLICE_ENV = "SPECDRILL_PORT_SLICE"
# The ports this process handed out: two picks before the first is bound must not return the same port.
_handed_out: set[int] = set()


def port_slice() -> tuple[int, int]:
    """(i, n) from SPECDRILL_PORT_SLICE; (0, 1), every port, when unset or malformed."""
    index, _, count = os.environ.get(PORT_SLICE_ENV, "").partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        return 0, 1
    return (i, n) if 0 <= i < n else (0, 1)


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low, high = (int(x) for x in handle.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port in TIME_WAIT counts as taken
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that nothing on this machine holds now."""
    low, high = ephemeral_range()
    pool: list[int] = []
    if low > _LOW:
        pool = list(range(_LOW, low))
    elif high < 65535:
        pool = list(range(max(high + 1, _LOW), 65536))
    index, slices = port_slice()
    pool = [port for port in pool if port % slices == index and port not in _handed_out]
    chosen: list[int] = []
    for port in random.sample(pool, len(pool)):
        if len(chosen) == count:
            _handed_out.update(chosen)
            return chosen
        if _is_free(port):
            chosen.append(port)
    # No room outside the ephemeral range on this machine: let the kernel choose, holding each until all are picked.
    held: list[socket.socket] = []
    try:
        while len(chosen) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
            chosen.append(int(s.getsockname()[1]))
    finally:
        for s in held:
            s.close()
    return chosen


def free_port() -> int:
    return free_ports(1)[0]


@dataclass(frozen=True)
class RayPorts:
    """One port per listener of a Ray node. Workers get none: 0/0 lets each worker bind a port of the kernel's."""

    gcs: int
    dashboard: int
    dashboard_agent_http: int
    dashboard_agent_grpc: int
    runtime_env_agent: int
    metrics_export: int
    node_manager: int
    object_manager: int
    client_server: int
    # Prometheus exporters of the head's autoscaler monitor and dashboard: no flag, Ray reads them from these
    # environment variables of the processes it starts (process_env()), else 44217 and 44227.
    autoscaler_metrics: int
    dashboard_metrics: int

    @classmethod
    def pick(cls) -> RayPorts:
        return cls(*free_ports(len(fields(cls))))

    def start_flags(self, *, head: bool = True) -> list[str]:
        """`ray start` flags."""
        flags = [
            f"--dashboard-agent-listen-port={self.dashboard_agent_http}",
            f"--dashboard-agent-grpc-port={self.dashboard_agent_grpc}",
            f"--runtime-env-agent-port={self.runtime_env_agent}",
            f"--metrics-export-port={self.metrics_export}",
            f"--node-manager-port={self.node_manager}",
            f"--object-manager-port={self.object_manager}",
            "--min-worker-port=0",
            "--max-worker-port=0",
        ]
        if head:
            flags += [f"--port={self.gcs}", f"--dashboard-port={self.dashboard}",
                      f"--ray-client-server-port={self.client_server}"]  # fmt: skip
        return flags

    def node_args(self, *, head: bool = True) -> dict[str, Any]:
        """Keyword arguments of ray.cluster_utils.Cluster(head_node_args=...) and Cluster.add_node(...) (Ray's
        RayParams names). No client server: a Cluster starts one only when given its port."""
        args: dict[str, Any] = {
            "dashboard_agent_listen_port": self.dashboard_agent_http,
            "metrics_agent_port": self.dashboard_agent_grpc,
            "runtime_env_agent_port": self.runtime_env_agent,
            "metrics_export_port": self.metrics_export,
            "node_manager_port": self.node_manager,
            "object_manager_port": self.object_manager,
            "min_worker_port": 0,
            "max_worker_port": 0,
        }
        if head:
            args.update(gcs_server_port=self.gcs, dashboard_port=self.dashboard)
        return args

    def process_env(self) -> dict[str, str]:
        """Environment variables for `ray start` (or for this process, before a Cluster starts its head here)."""
        return {"AUTOSCALER_METRIC_PORT": str(self.autoscaler_metrics),
                "DASHBOARD_METRIC_PORT": str(self.dashboard_metrics)}  # fmt: skip

    def env(self) -> dict[str, str]:
        """RAY_PORT (the GCS, as infra/ray-up.sh always named it), RAY_<LISTENER>_PORT and process_env()'s variables,
        the form the infra scripts read."""
        return {_env_name(name): str(port) for name, port in asdict(self).items()}

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> RayPorts:
        """Ports from those variables where set, free ones elsewhere."""
        env = dict(os.environ if env is None else env)
        picked = iter(free_ports(len(fields(cls))))
        values = {}
        for field in fields(cls):
            given = env.get(_env_name(field.name))
            values[field.name] = int(given) if given else next(picked)
        return cls(**values)


def _env_name(listener: str) -> str:
    return {"gcs": "RAY_PORT", "autoscaler_metrics": "AUTOSCALER_METRIC_PORT",
            "dashboard_metrics": "DASHBOARD_METRIC_PORT"}.get(listener, f"RAY_{listener.upper()}_PORT")  # fmt: skip


def processes_of(temp_dir: str) -> list[Any]:
    """The processes of the Ray whose temp dir is `temp_dir`: those whose command line names it (GCS, raylet,
    dashboard, monitors) and all their descendants (agents, workers, job drivers, whatever a worker started)."""
    import psutil

    # The dir itself or a path under it: /tmp/ray must not match /tmp/ray2 or /tmp/ray-other/...
    names = {temp_dir.rstrip("/"), os.path.realpath(temp_dir)}

    def names_it(part: str) -> bool:
        return any(part == n or part.endswith("=" + n) or n + "/" in part for n in names)

    # `ray start` launches the Ray client server itself and exits: the server is no descendant of the GCS or the
    # raylet, and its command line names the GCS address, not the temp dir (ray/_private/services.py,
    # start_ray_client_server). infra/ray-up.sh records that port in TEMP_DIR/ports.env.
    gcs_port = _recorded_gcs_port(temp_dir)

    def client_server_of_ours(cmdline: Sequence[str]) -> bool:
        return (
            gcs_port is not None
            and "ray.util.client.server" in cmdline
            and any(part.startswith("--address=") and part.endswith(f":{gcs_port}") for part in cmdline)
        )

    roots = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or ()
        if process.pid != os.getpid() and (any(names_it(part) for part in cmdline) or client_server_of_ours(cmdline)):
            roots.append(process)
    found = {p.pid: p for p in roots}
    for process in roots:
        try:
            found.update({child.pid: child for child in process.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def _recorded_gcs_port(temp_dir: str) -> int | None:
    """RAY_PORT from the ports.env that infra/ray-up.sh wrote into the temp dir, if it did."""
    try:
        with open(os.path.join(temp_dir, "ports.env")) as handle:
            lines = dict(line.strip().split("=", 1) for line in handle if "=" in line)
        return int(lines["RAY_PORT"])
    except (OSError, KeyError, ValueError):
        return None


def stop(temp_dir: str, grace_s: float = 10.0) -> int:
    """Stop that one Ray (SIGTERM, then SIGKILL after `grace_s`), unlike `ray stop`, which stops every Ray on the
    machine. Returns how many processes were stopped.

    The GCS goes last, once the rest have ended: a raylet signalled together with its GCS waits ~10 s for the GCS
    before it exits, and the GCS outlives SIGTERM while its raylet is up, so signalling all at once took every
    stop to the SIGKILL after `grace_s` (a loopback head: 15 s; the GCS last: 4 s, 2026-12-06)."""
    import psutil

    # Collected before any is signalled: a worker whose raylet died is reparented and no longer a descendant.
    victims = processes_of(temp_dir)
    gcs = [process for process in victims if _is_gcs(process)]
    _end([process for process in victims if process not in gcs], grace_s)
    _end(gcs, grace_s)
    # Workers that were started between the listing and the SIGTERM.
    late = processes_of(temp_dir)
    for process in late:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(late, timeout=5)
    return len(victims) + len(late)


def _is_gcs(process: Any) -> bool:
    import psutil

    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return False
    return bool(cmdline) and os.path.basename(cmdline[0]) == "gcs_server"


def _end(processes: list[Any], grace_s: float) -> None:
    """SIGTERM, and SIGKILL to those still there after `grace_s`."""
    import psutil

    for process in processes:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=5)


_LISTENER_NAMES = {
    "gcs": "GCS", "dashboard": "dashboard", "dashboard_agent_http": "dashboard agent's HTTP (runs jobs)",
    "dashboard_agent_grpc": "dashboard agent's gRPC", "runtime_env_agent": "runtime-env agent",
    "metrics_export": "metrics export", "node_manager": "node manager", "object_manager": "object manager",
    "client_server": "Ray client server", "autoscaler_metrics": "autoscaler metrics",
    "dashboard_metrics": "dashboard metrics",
}  # fmt: skip


def held_ports(ports: RayPorts, temp_dir: str) -> list[str]:
    """One line per port of `ports` that a process of another Ray (or anything else) listens on."""
    ours = {p.pid for p in processes_of(temp_dir)}
    lines = []
    for name, port in asdict(ports).items():
        holders = _listener_pids(port) - ours
        if holders:
            lines.append(f"port {port} ({_LISTENER_NAMES[name]}, {_env_name(name)}) is held by {_describe(holders)}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "held":  # TEMP_DIR; the ports from the environment (all set: ports.env)
        held = held_ports(RayPorts.from_env(), argv[1])
        for line in held:
            print(line)
        return 1 if held else 0
    if argv[:1] == ["ports"]:
        for name, value in RayPorts.from_env().env().items():
            print(f"{name}={value}")
        return 0
    if len(argv) == 2 and argv[0] == "stop":
        if not os.path.isdir(argv[1]):
            print(f"no Ray temp dir {argv[1]}", file=sys.stderr)
            return 1
        stopped = stop(argv[1])
        print(f"stopped {stopped} processes of the Ray in {argv[1]}")
        return 0
    if len(argv) == 5 and argv[0] == "wait-job-agent":  # TEMP_DIR DASHBOARD_PORT AGENT_PORT TIMEOUT_S
        why = wait_for_job_agent(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))
        if why:
            print(why, file=sys.stderr)
        return 0 if why is None else 1
    print(__doc__, file=sys.stderr)
    return 2


def _listener_pids(port: int) -> set[int]:
    import psutil

    return {c.pid for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid is not None}  # fmt: skip


def _describe(pids: set[int]) -> str:
    import psutil

    names = []
    for pid in sorted(pids):
        try:
            names.append(f"{psutil.Process(pid).name()} (pid {pid})")
        except psutil.NoSuchProcess:
            names.append(f"pid {pid}")
    return ", ".join(names) or "another process"


def wait_for_job_agent(temp_dir: str, dashboard_port: int, agent_port: int, timeout_s: float) -> str | None:
    """None once this Ray's dashboard answers and its dashboard agent (which runs submitted jobs) listens on
    `agent_port`; else, after `timeout_s`, one line saying why not. Quiet meanwhile: no traceback per retry."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    dashboard_up = False
    while True:
        if not dashboard_up:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{dashboard_port}/api/version", timeout=5):
                    dashboard_up = True
            except urllib.error.HTTPError:
                dashboard_up = True  # it answered (token auth may refuse an anonymous request): it is up
            except OSError:
                pass
        ours = {p.pid for p in processes_of(temp_dir)}
        holders = _listener_pids(agent_port)
        if dashboard_up and holders & ours:
            return None
        if time.monotonic() > deadline:
            break
        time.sleep(1)
    if holders and not holders & ours:
        return (f"Ray's job agent could not start: its port {agent_port} is held by {_describe(holders)}; "
                "pick another with RAY_DASHBOARD_AGENT_HTTP_PORT or leave it unset for a free one")  # fmt: skip
    if not dashboard_up:
        return f"Ray's dashboard did not answer on 127.0.0.1:{dashboard_port} within {timeout_s:.0f} s"
    return (f"Ray's job agent did not listen on 127.0.0.1:{agent_port} within {timeout_s:.0f} s: see "
            f"{temp_dir}/session_latest/logs/dashboard_agent.log")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
