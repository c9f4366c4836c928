"""Ray for a test module: a head on loopback with its own temp dir and a free port for every listener, stopped by
its own processes afterwards (never `ray stop`, which stops every Ray on the machine: other test sessions' too).

- `ray_head()`: `ray start --head` in a subprocess; a failed start raises with Ray's stderr.
- `local_ray()`: that head with this process connected to it as a driver (ray.init can set neither the dashboard
  agent's ports nor the GCS port of a Ray it starts, so it joins one started here).
- `cluster_node_args()`, `cluster_head_env()`: the ports for a ray.cluster_utils.Cluster node (head_node_args= /
  add_node(**...)) and for its head's metrics exporters.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tools.localray import RayPorts, free_port, free_ports, processes_of, stop

__all__ = ["RayPorts", "cluster_head_env", "cluster_node_args", "free_port", "free_ports", "is_loopback",
           "listeners", "local_ray", "ray_head", "stop"]  # fmt: skip

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every Ray listener on 127.0.0.1

RAY = str(Path(sys.executable).parent / "ray")
START_ATTEMPTS = 3  # a port picked free can still be taken before Ray binds it: the next attempt picks new ones


def cluster_node_args(*, head: bool) -> dict[str, Any]:
    """Free ports for one node of a ray.cluster_utils.Cluster, as keyword arguments:
    `Cluster(head_node_args={..., **cluster_node_args(head=True)})`, `add_node(..., **cluster_node_args(head=False))`.
    Cluster's own defaults give every head 8265 and 52365, which another Ray on the machine may hold. The head's
    two metrics exporters take their ports from this process's environment: see cluster_head_env()."""
    return RayPorts.pick().node_args(head=head)


@contextmanager
def cluster_head_env() -> Iterator[dict[str, str]]:
    """This process's environment set, while a Cluster head starts inside it, so that the head's autoscaler monitor
    and dashboard export their metrics on free ports (else 44217 and 44227, which every other Ray here wants)."""
    variables = RayPorts.pick().process_env()
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield variables
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def ray_head(
    num_cpus: int = 8,
    *,
    num_gpus: int | None = None,
    env: dict[str, str] | None = None,
    token: bool = False,
    prefix: str = "sdray",
    extra: tuple[str, ...] = (),
) -> Iterator[dict[str, Any]]:
    """A `ray start --head` on 127.0.0.1. Yields env (for `ray`/`specdrill` subprocesses), address (the
    dashboard's http URL, for `ray job`), gcs_address, temp_dir, ports (RayPorts), dashboard, metrics_port.

    token: Ray's token auth with a token of this head's own, in env (RAY_AUTH_TOKEN), so that nothing depends on
    ~/.ray/auth_token existing (`ray start` in token mode refuses to start without one: a clean machine). Without
    it auth is off explicitly: `ray start` turns it on by itself whenever ~/.ray/auth_token exists, while a driver
    that joins by address does not, and then cannot connect."""
    env = {**(os.environ if env is None else env), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    if token:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    else:
        env["RAY_AUTH_MODE"] = "disabled"
        env.pop("RAY_AUTH_TOKEN", None)
    failures = []
    for _attempt in range(START_ATTEMPTS):
        # Short: Ray's socket paths have a length limit.
        temp_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        ports = RayPorts.pick()
        command = [RAY, "start", "--head", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
                   *ports.start_flags(), f"--num-cpus={num_cpus}", f"--temp-dir={temp_dir}",
                   "--disable-usage-stats", *extra]  # fmt: skip
        if num_gpus is not None:
            command.append(f"--num-gpus={num_gpus}")
        try:
            started = subprocess.run(command, env={**env, **ports.process_env()}, capture_output=True, text=True,
                                     timeout=180, check=False)  # fmt: skip
            code, out, err = started.returncode, started.stdout, started.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = None, str(exc.stdout or ""), str(exc.stderr or "")
        # stop() finds the Ray client server, which `ray start` leaves outside the GCS's and raylet's process trees,
        # by the GCS port recorded here (as infra/ray-up.sh records it): without it a server outlived its test.
        Path(temp_dir, "ports.env").write_text(f"RAY_PORT={ports.gcs}\n")
        if code == 0:
            break
        stop(temp_dir)  # whatever it had started
        shutil.rmtree(temp_dir, ignore_errors=True)
        failures.append(f"`ray start` with {ports} exited {code}:\n{err[-4000:] or out[-4000:]}")
        print(failures[-1], file=sys.stderr)  # shown by pytest with the test that needed it
    else:
        raise RuntimeError(f"`ray start --head` failed {START_ATTEMPTS} times:\n" + "\n".join(failures))
    try:
        yield {"env": env, "address": f"http://127.0.0.1:{ports.dashboard}", "gcs_address": f"127.0.0.1:{ports.gcs}",
               "temp_dir": temp_dir, "ports": ports, "dashboard": ports.dashboard,
               "metrics_port": ports.metrics_export}  # fmt: skip
    finally:
        stop(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@contextmanager
def local_ray(num_cpus: int = 8, num_gpus: int | None = None) -> Iterator[dict[str, object]]:
    """`ray_head()` with this process connected as a driver (Serve shut down and disconnected afterwards). Ray's
    processes inherit this process's environment as it is now."""
    import ray
    from ray import serve

    with ray_head(num_cpus, num_gpus=num_gpus) as head:
        ray.init(address=head["gcs_address"], namespace="specdrill-tests", log_to_driver=False)
        try:
            yield {"gcs_address": head["gcs_address"], "metrics_port": head["metrics_port"],
                   "temp_dir": head["temp_dir"]}  # fmt: skip
        finally:
            try:
                serve.shutdown()
            finally:
                ray.shutdown()


def is_loopback(ip: str) -> bool:
    return ip == "::1" or ip.startswith(("127.", "::ffff:127."))


def listeners(marker: str) -> list[tuple[str, int, str]]:
    """Listening TCP sockets (address, port, process name) of the Ray whose temp dir is `marker` (GCS, raylet,
    dashboard, agents, workers) and of its processes' descendants (the load workers' Locust processes)."""
    import psutil

    pids = {p.pid for p in processes_of(marker)}
    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.NoSuchProcess:
                continue
            found.append((conn.laddr.ip, conn.laddr.port, name))
    return found
