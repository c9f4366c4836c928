"""A Ray cluster for a test module: in-process head on loopback, its own temp dir, shut down afterwards."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every Ray listener on 127.0.0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_ray(num_cpus: int = 8, **kwargs: object) -> Iterator[dict[str, object]]:
    import ray
    from ray import serve

    temp_dir = tempfile.mkdtemp(prefix="sdray", dir="/tmp")  # short: Ray's socket paths have a length limit
    metrics_port = free_port()
    context = ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        namespace="specdrill-tests",
        _temp_dir=temp_dir,
        _metrics_export_port=metrics_port,
        log_to_driver=False,
        **kwargs,  # type: ignore[arg-type]
    )
    try:
        yield {"gcs_address": context.address_info["gcs_address"], "metrics_port": metrics_port}
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)


def is_loopback(ip: str) -> bool:
    return ip == "::1" or ip.startswith(("127.", "::ffff:127."))


def listeners(marker: str) -> list[tuple[str, int, str]]:
    """Listening TCP sockets (address, port, process name) of every process whose command line names `marker`
    (a Ray temp dir: GCS, raylet, dashboard, agents, workers) and of their descendants (the load workers'
    Locust processes)."""
    import psutil

    roots = [p for p in psutil.process_iter(["cmdline"]) if any(marker in x for x in p.info["cmdline"] or ())]
    pids = {p.pid for p in roots}
    for process in roots:
        try:
            pids.update(child.pid for child in process.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.NoSuchProcess:
                continue
            found.append((conn.laddr.ip, conn.laddr.port, name))
    return found
