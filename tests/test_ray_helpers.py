"""The suite's own Ray head (tests/ray_helpers.py) leaves nothing behind: `ray start` launches the Ray client server
outside the GCS's and raylet's process trees, and before the head recorded its GCS port for `stop` to find it
by, every test's client server outlived its Ray (2026-12-03: one still running minutes after its test)."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.ray_helpers import ray_head
from tools.localray import processes_of

pytestmark = [pytest.mark.integration]


def _client_servers(gcs_port: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "ray.util.client.server" in cmdline and f"--address=127.0.0.1:{gcs_port}" in cmdline:
            found.append(process)
    return found


def test_the_heads_processes_and_its_client_server_are_all_stopped() -> None:
    with ray_head(2, prefix="sdleak") as head:
        port = head["ports"].gcs
        deadline = time.monotonic() + 60
        while not _client_servers(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        servers = _client_servers(port)
        assert servers, "ray start launched no client server"
        everything = processes_of(head["temp_dir"])
        assert {s.pid for s in servers} <= {p.pid for p in everything}
    alive = [p for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [" ".join(p.cmdline()[:3]) for p in alive]
