"""End to end: `ray job submit ... -- specdrill run campaign.yaml` on a loopback Ray head; a job stopped mid-unit
(`ray job stop`), then resumed by a second job. Each job pays seconds to start its driver, deploy, and write the
report: the campaigns are as short as what they prove allows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadshapes.trace import read_traces
from tests import REPO
from tests.ray_helpers import free_port, is_loopback, listeners
from tests.ray_helpers import ray_head as start_ray_head
from tools.localray import wait_for_job_agent

RAY = str(Path(sys.executable).parent / "ray")


@pytest.fixture(scope="module")
def ray_head() -> Iterator[dict[str, Any]]:
    # Ray's token auth, as a cluster would have it: the job clients below send the head's token (in head["env"]).
    with start_ray_head(8, token=True, prefix="sdjob") as head:
        ports = head["ports"]
        why = wait_for_job_agent(head["temp_dir"], ports.dashboard, ports.dashboard_agent_http, 300)
        assert why is None, why
        # One Serve per cluster: every campaign on this head uses the port the first one started it on.
        yield {**head, "serve_port": free_port()}


def _submit(head: dict[str, Any], campaign: Path, job_id: str | None = None) -> subprocess.CompletedProcess[str]:
    named = ["--submission-id", job_id] if job_id else []
    command = [RAY, "job", "submit", "--address", head["address"], *named, "--working-dir", str(REPO),
               "--", "specdrill", "run", str(campaign)]  # fmt: skip
    deadline = time.monotonic() + 300  # the job agent can take minutes on a busy 2-core machine
    while True:
        result = subprocess.run(command, env=head["env"], capture_output=True, text=True, timeout=600, check=False)
        # Right after `ray start` the dashboard may not have a job agent yet (slow on a busy machine).
        if "No available agent to submit job" not in result.stderr or time.monotonic() > deadline:
            return result
        time.sleep(3)


def test_job_submit_runs_the_campaign_with_a_log_line_per_unit(ray_head: dict[str, Any], tmp_path: Path) -> None:
    output = tmp_path / "run"
    campaign = {
        "name": "jobtest",
        "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": {
            "first": {"kind": "quiet", "rate": 4, "duration_s": 2},
            "second": {"kind": "ramp", "rate_from": 2, "rate_to": 8, "duration_s": 2},
        },
        "mix": {"entries": [{"workload": "chat", "weight": 1}]},
        "output": str(output),
        "load": {"workers": 1, "cpus_per_worker": 0.5, "drain_s": 20},
        "serve": {"host": "127.0.0.1", "port": ray_head["serve_port"]},
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign))

    job_id = f"jobtest-{os.getpid()}"
    first = _submit(ray_head, path, job_id)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "operating map by offered rate" in first.stdout and "succeeded" in first.stdout + first.stderr
    # The job's log (the dashboard's job page shows the same): a line per unit started and finished, then the
    # report's verdict; no progress bar, which is for terminals only.
    log = _ray(ray_head, "logs", job_id).stdout
    for arm, shape in (("off-single", "first"), ("off-single", "second"), ("fixed3-single", "first")):
        assert re.search(rf"^unit \d/4 arm={arm} shape={shape} repeat=0 started$", log, re.M), log[-3000:]
        finished = (rf"^unit \d/4 arm={arm} shape={shape} repeat=0 finished: requests=(\d+) ok=(\d+) "
                    r"errors=(\d+)(?: \([a-z_]+ \d+(?:, [a-z_]+ \d+)*\))? "
                    r"tpot_p50=[\d.]+ms send_lateness_p99=[\d.]+ms saturated=(yes|no) "
                    # the simulated engine reports its lag (how late it handed tokens out)
                    r"engine_lag_p99=[\d.]+ms engine_lag_share=\d+% engine_lagged=(yes|no) took=[\d.]+s$")
        done = re.search(finished, log, re.M)
        # a busy machine may time a request out: the line counts it, the trace has its row either way
        assert done and int(done.group(1)) == int(done.group(2)) + int(done.group(3)) > 0, log[-3000:]
    last = re.search(r"^unit 4/4 .* finished: ", log, re.M)
    assert last and last.start() < log.index("executed policy"), log[-3000:]
    assert "all gates pass" in log or "a gate failed" in log
    assert not re.search(r"\d/4 units", log)  # rich's progress bar
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["arms"]["fixed3-single"]["resolved_speculative_config"]["num_speculative_tokens"] == 3
    scheduled = {k: v["scheduled"] for k, v in manifest["units"].items()}
    table = read_traces(str(output / "traces"))
    assert table.num_rows == sum(scheduled.values()) > 10
    assert (output / "report.html").exists() and (output / "summary.json").exists()
    assert list((output / "timelines").rglob("r0.parquet"))
    # A rerun through a job is the next test's (a job stopped mid-unit, then resumed); a unit whose rows were
    # merged but whose marker is missing is redone the same way (tests/orchestrator/rundir/test_rundir.py, and
    # the one unit loop every runner shares in tests/orchestrator/virtual/test_simulate_campaign.py).


def _ray(head: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RAY, "job", args[0], "--address", head["address"], *args[1:]], env=head["env"],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def test_a_stopped_job_rerun_skips_complete_units_and_redoes_the_partial_one(
    ray_head: dict[str, Any], tmp_path: Path
) -> None:
    output = tmp_path / "run"
    campaign = {
        "name": "stoptest",
        "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off"},
        "shapes": {
            # units run in shape-name order: "a-short" completes, "b-long" is the one interrupted
            "a-short": {"kind": "quiet", "rate": 4, "duration_s": 3},
            # long enough that `ray job stop` (seconds for its CLI to start on a busy machine) lands inside it;
            # the rerun plays it whole
            "b-long": {"kind": "quiet", "rate": 4, "duration_s": 20},
        },
        "mix": {"entries": [{"workload": "chat", "weight": 1}]},
        "output": str(output),
        "load": {"workers": 1, "cpus_per_worker": 0.5, "drain_s": 20, "flush_rows": 2},
        "serve": {"host": "127.0.0.1", "port": ray_head["serve_port"]},
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign))
    job_id = f"stoptest-{os.getpid()}"
    command = ["submit", "--no-wait", "--submission-id", job_id, "--working-dir", str(REPO), "--",
               "specdrill", "run", str(path)]  # fmt: skip
    deadline = time.monotonic() + 300  # the job agent can take minutes on a busy 2-core machine
    while "No available agent" in (submitted := _ray(ray_head, *command)).stderr and time.monotonic() < deadline:
        time.sleep(3)
    assert submitted.returncode == 0, submitted.stderr[-2000:]

    # Stop the driver once the short unit is complete and the long one has flushed rows of its own.
    short_marker = output / "units/off-single/a-short/r0.json"
    long_parts = output / "traces/arm=off-single/shape=b-long"
    deadline = time.monotonic() + 300
    status: subprocess.Popen[str] | None = None
    while not (short_marker.exists() and len(list(long_parts.glob("*.parquet"))) >= 2):
        # `ray job status` takes seconds to start on a busy machine: asked in the background, so that the files
        # are looked at every 0.2 s and the stop below comes early in the long unit.
        if status is None:
            status = subprocess.Popen([RAY, "job", "status", "--address", ray_head["address"], job_id],
                                      env=ray_head["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)  # fmt: skip
        elif status.poll() is not None:
            said = status.communicate()[0]
            ended = any(w in said for w in ("FAILED", "SUCCEEDED"))
            status = None
            if ended:
                pytest.fail(_ray(ray_head, "logs", job_id).stdout[-3000:])
        if time.monotonic() > deadline:
            pytest.fail(_ray(ray_head, "logs", job_id).stdout[-3000:])
        time.sleep(0.2)
    if status is not None:
        status.kill()
        status.wait()
    # Mid-unit, everything is up (GCS, raylet, dashboard and its agents, the driver, Serve's proxy and the arm,
    # the load worker and its Locust process): every listener is on loopback.
    sockets = listeners(ray_head["temp_dir"])
    assert [s for s in sockets if not is_loopback(s[0])] == []
    ports = {port for _, port, _ in sockets}
    assert {ray_head["dashboard"], campaign["serve"]["port"]} <= ports and len(sockets) >= 8, sockets  # type: ignore[index]
    stopped = _ray(ray_head, "stop", job_id)  # SIGTERM, then SIGKILL; returns once the job has stopped
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    status = _ray(ray_head, "status", job_id)
    assert "stopped" in status.stdout + status.stderr
    assert not (output / "units/off-single/b-long/r0.json").exists()
    # The driver said how far it got and how to go on, before the cleanup that SIGKILL may cut short.
    stopped_log = _ray(ray_head, "logs", job_id).stdout
    assert ("specdrill: stopped by SIGTERM: 1 of 2 units complete; unit arm=off-single shape=b-long repeat=0 was "
            "in flight and is not complete") in stopped_log, stopped_log[-3000:]  # fmt: skip
    assert f"resume with: specdrill run {path}\n" in stopped_log and "Traceback" not in stopped_log
    partial_rows = read_traces(str(long_parts.parent.parent)).num_rows
    kept_mtime = short_marker.stat().st_mtime_ns

    rerun = _submit(ray_head, path)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert short_marker.stat().st_mtime_ns == kept_mtime  # complete unit skipped
    assert f"campaign stoptest: resuming in {output}: 1 of 2 units already complete, 1 to run" in rerun.stdout
    assert "unit arm=off-single shape=a-short repeat=0 skipped: already complete" in rerun.stdout
    manifest = json.loads((output / "manifest.json").read_text())
    scheduled = {k: v["scheduled"] for k, v in manifest["units"].items()}
    ids = read_traces(str(output / "traces")).column("request_id").to_pylist()
    assert partial_rows < len(ids)
    assert len(ids) == len(set(ids)) == sum(scheduled.values())  # partial unit redone, nothing duplicated
    assert manifest["resumed"] == 1
    assert "report.html" in rerun.stdout
