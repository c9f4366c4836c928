"""tools/localray.py without starting Ray: ports, the stop that only stops its own Ray, the job-agent wait."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import REPO
from tools import localray
from tools.localray import (
    RayPorts,
    ephemeral_range,
    free_ports,
    held_ports,
    processes_of,
    stop,
    wait_for_job_agent,
)

# Ray's fixed defaults, which another Ray on the machine may hold.
RAY_DEFAULTS = {6379, 8265, 10001, 44217, 44227, 52365}


def test_ports_are_distinct_free_and_out_of_the_kernels_way() -> None:
    ports = RayPorts.pick()
    values = list(vars(ports).values())
    assert len(set(values)) == len(values) == 11
    low, high = ephemeral_range()
    assert all(not low <= p <= high and p >= 20000 for p in values) and not set(values) & RAY_DEFAULTS
    for port in values:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert len(set(free_ports(200))) == 200


def test_every_listener_flag_of_ray_start_and_every_cluster_argument() -> None:
    ports = RayPorts.pick()
    flags = dict(f.removeprefix("--").split("=") for f in ports.start_flags())
    assert flags == {
        "port": str(ports.gcs), "dashboard-port": str(ports.dashboard),
        "dashboard-agent-listen-port": str(ports.dashboard_agent_http),
        "dashboard-agent-grpc-port": str(ports.dashboard_agent_grpc),
        "runtime-env-agent-port": str(ports.runtime_env_agent), "metrics-export-port": str(ports.metrics_export),
        "node-manager-port": str(ports.node_manager), "object-manager-port": str(ports.object_manager),
        "ray-client-server-port": str(ports.client_server), "min-worker-port": "0", "max-worker-port": "0",
    }  # fmt: skip
    assert not {"port", "dashboard-port", "ray-client-server-port"} & {
        f.removeprefix("--").split("=")[0] for f in ports.start_flags(head=False)
    }
    # Every name is one Ray's RayParams takes (what Cluster passes on), so a typo cannot silently fall back.
    from ray._private.parameter import RayParams

    RayParams(**ports.node_args(head=True))
    assert ports.process_env() == {"AUTOSCALER_METRIC_PORT": str(ports.autoscaler_metrics),
                                   "DASHBOARD_METRIC_PORT": str(ports.dashboard_metrics)}  # fmt: skip


def test_ports_given_in_the_environment_are_kept_and_the_rest_picked() -> None:
    ports = RayPorts.from_env({"RAY_PORT": "6390", "RAY_DASHBOARD_AGENT_HTTP_PORT": "52999"})
    assert ports.gcs == 6390 and ports.dashboard_agent_http == 52999
    assert ports.dashboard not in RAY_DEFAULTS and RayPorts.from_env(ports.env()) == ports
    result = subprocess.run([sys.executable, "-m", "tools.localray", "ports"], cwd=REPO, capture_output=True,
                            text=True, check=True, env={"PATH": "/usr/bin:/bin", "RAY_PORT": "6391"})  # fmt: skip
    lines = dict(line.split("=") for line in result.stdout.split())
    assert lines["RAY_PORT"] == "6391" and len(lines) == 11


@pytest.fixture
def fake_ray(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """Processes that look like a Ray's to `stop` (their command line names its temp dir, as gcs_server's and
    raylet's do) with a child that does not (a worker), and one of a neighbouring temp dir."""
    temp_dir = str(tmp_path / "ray")
    parent = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
              " time.sleep(60)")  # fmt: skip
    ours = subprocess.Popen([sys.executable, "-c", parent, f"--log_dir={temp_dir}/session_1/logs"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--temp-dir={temp_dir}2"])
    try:
        yield temp_dir, [ours, other]
    finally:
        for process in (ours, other):
            process.kill()
            process.wait()


def test_stop_ends_its_own_ray_and_nothing_else(fake_ray: tuple[str, list[subprocess.Popen[bytes]]]) -> None:
    temp_dir, (ours, other) = fake_ray
    deadline = time.monotonic() + 10
    while len(found := processes_of(temp_dir)) < 2 and time.monotonic() < deadline:  # the child starting
        time.sleep(0.1)
    assert {p.pid for p in found} > {ours.pid} and other.pid not in {p.pid for p in found}
    assert stop(temp_dir, grace_s=5) == 2
    assert ours.wait(5) is not None and other.poll() is None and processes_of(temp_dir) == []


# A process that notes, when SIGTERM reaches it, its own name and whether the other one was still there, then ends.
NOTE_ON_TERM = """
import os, signal, sys, time
name, other, notes = sys.argv[1], sys.argv[2], sys.argv[3]
def noted(*_):
    with open(notes, "a") as out:
        out.write(f"{name} {os.path.exists(f'/proc/{open(other).read()}')}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, noted)
open(sys.argv[4], "w").write(str(os.getpid()))
while True:
    time.sleep(1)
"""


def test_stop_signals_the_gcs_only_once_the_rest_of_its_ray_has_ended(tmp_path: Path) -> None:
    # A raylet signalled together with its GCS waits ~10 s for it before it exits: the GCS must go last.
    temp_dir = str(tmp_path / "ray")
    notes, gcs_pid, raylet_pid = tmp_path / "notes", tmp_path / "gcs.pid", tmp_path / "raylet.pid"
    started = [
        subprocess.Popen(["/x/ray/core/src/ray/gcs/gcs_server", "-c", NOTE_ON_TERM, "gcs", str(raylet_pid),
                          str(notes), str(gcs_pid), f"--log_dir={temp_dir}/session_1/logs"], executable=sys.executable),
        subprocess.Popen(["/x/ray/core/src/ray/raylet/raylet", "-c", NOTE_ON_TERM, "raylet", str(gcs_pid),
                          str(notes), str(raylet_pid), f"--temp_dir={temp_dir}"], executable=sys.executable),
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not (gcs_pid.exists() and raylet_pid.exists()) and time.monotonic() < deadline:  # handlers set
            time.sleep(0.05)
        assert stop(temp_dir, grace_s=5) == 2
        assert notes.read_text().splitlines() == ["raylet True", "gcs False"]
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_the_job_agent_wait_says_in_one_line_who_holds_its_port(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        why = wait_for_job_agent(str(tmp_path), free_ports(1)[0], port, timeout_s=1)
    assert why is not None and len(why.splitlines()) == 1
    assert f"its port {port} is held by " in why and f"(pid {os.getpid()})" in why
    assert "RAY_DASHBOARD_AGENT_HTTP_PORT" in why


def test_a_held_port_is_named_with_its_listener_and_variable(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        ports = RayPorts.from_env({"RAY_DASHBOARD_AGENT_HTTP_PORT": str(port)})
        (line,) = held_ports(ports, str(tmp_path))
    assert line.startswith(f"port {port} (dashboard agent's HTTP (runs jobs), RAY_DASHBOARD_AGENT_HTTP_PORT) is held")
    assert held_ports(ports, str(tmp_path)) == []  # released


def test_stop_ends_the_ray_client_server_that_ray_start_left_outside_its_tree(tmp_path: Path) -> None:
    # `ray start` launches `python setup_worker.py -m ray.util.client.server --address=IP:GCS_PORT ...` and exits:
    # no temp dir in its command line, no parent of ours. infra/ray-up.sh records the GCS port in ports.env.
    temp_dir = tmp_path / "ray"
    temp_dir.mkdir()
    (temp_dir / "ports.env").write_text("RAY_PORT=26391\nRAY_CLIENT_SERVER_PORT=26392\n")
    sleep = "import time; time.sleep(60)"
    ours = subprocess.Popen([sys.executable, "-c", sleep, "-m", "ray.util.client.server", "--address=127.0.0.1:26391"])
    other = subprocess.Popen([sys.executable, "-c", sleep, "-m", "ray.util.client.server", "--address=127.0.0.1:6391"])
    try:
        deadline = time.monotonic() + 10
        while ours.pid not in {p.pid for p in processes_of(str(temp_dir))} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {p.pid for p in processes_of(str(temp_dir))} == {ours.pid}
        assert stop(str(temp_dir), grace_s=5) == 1
        assert ours.wait(5) is not None and other.poll() is None
    finally:
        for process in (ours, other):
            process.kill()
            process.wait()


def test_processes_with_disjoint_slices_never_pick_the_same_port(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two test workers pick at the same moment; the gap before each server binds is where a shared pick collides.
    picks: dict[int, list[int]] = {}
    for index in (0, 1):
        monkeypatch.setenv(localray.PORT_SLICE_ENV, f"{index}/2")
        picks[index] = localray.free_ports(200)
        assert all(port % 2 == index for port in picks[index])
    assert not set(picks[0]) & set(picks[1])
    monkeypatch.setenv(localray.PORT_SLICE_ENV, "not a slice")
    assert localray.port_slice() == (0, 1)


def test_one_process_never_hands_out_a_port_twice() -> None:
    # Nothing binds between the picks: without the memory of what was handed out, the same free port can return.
    first = localray.free_ports(300)
    second = localray.free_ports(300)
    assert len(set(first)) == 300 and not set(first) & set(second)
