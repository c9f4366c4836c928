"""Simulated arms on Ray Serve (loopback): OpenAI compatibility, telemetry of what ran, deploy and teardown."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.execute.deploy import deploy
from orchestrator.plan.campaign import Campaign
from serve_apps.policies import parse_policy
from tests.ray_helpers import free_port, local_ray
from tests.tiny_campaigns import EAGLE, four_arms

SCHEDULE = "dynamic:3:1-2=3,3-8=1,9-512=0"
MODEL = "sim-llama3.1-8b-h100-eagle"


def _campaign(port: int, name: str = "simtest", **extra: Any) -> dict[str, Any]:
    return four_arms(name, **{
        "engine": {**EAGLE, "time_scale": 2.0}, "policies": {"off": "off", "fixed3": "fixed:3", "dyn": SCHEDULE},
        "serve": {"host": "127.0.0.1", "port": port}, **extra,
    })  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    with local_ray(num_cpus=8) as info:
        port = free_port()
        campaign = Campaign.model_validate(_campaign(port))
        urls = deploy(campaign)
        yield {**info, "urls": urls, "port": port, "campaign": campaign}


def _table() -> list[int]:
    policy = parse_policy(SCHEDULE, default_method="eagle", default_model="d")
    return policy.resolve().k_table(512)


def _client(url: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def _complete(url: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault("max_tokens", 24)
    r = _client(url).completions.create(model=MODEL, prompt="one two three four", **kw)
    return r.model_dump()


def test_deploy_prints_urls_for_every_arm(cluster: dict[str, Any]) -> None:
    assert set(cluster["urls"]) == {"off-single", "fixed3-single", "dyn-single", "dyn-dp2"}
    for name, url in cluster["urls"].items():
        assert url == f"http://127.0.0.1:{cluster['port']}/simtest/{name}"


def test_openai_client_non_streaming_and_streaming(cluster: dict[str, Any]) -> None:
    client = _client(cluster["urls"]["fixed3-single"])
    assert [m.id for m in client.models.list().data] == [MODEL]
    done = client.completions.create(model=MODEL, prompt="a b c", max_tokens=10, extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 10 and done.usage.prompt_tokens == 3
    assert done.choices[0].finish_reason == "length" and done.choices[0].text
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=12, seed=3,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    last = chunks[-1].model_dump()
    assert last["metrics"]["speculative_decoding"]["num_spec_tokens"] == 3
    assert last["specdrill"]["arm"] == "fixed3-single"
    plain = client.completions.create(model=MODEL, prompt="x y", max_tokens=6, stream=True)
    pieces = list(plain)
    assert pieces[-1].choices[0].finish_reason == "length"
    assert pieces[-1].model_dump()["specdrill"]["executed"]["step_k"]  # telemetry on the final chunk


def test_request_id_is_echoed_and_used(cluster: dict[str, Any]) -> None:
    client = _client(cluster["urls"]["off-single"])
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hello", max_tokens=4, extra_headers={"x-request-id": "rid-42"}
    )
    assert raw.headers["x-request-id"] == "rid-42"
    body = raw.parse().model_dump()
    assert body["id"] == "rid-42" and body["specdrill"]["request_id"] == "rid-42"


def test_off_arm_runs_no_speculation(cluster: dict[str, Any]) -> None:
    body = _complete(cluster["urls"]["off-single"])
    assert body["metrics"]["speculative_decoding"] is None
    t = body["specdrill"]
    assert t["configured_speculative_config"] is None and t["resolved_speculative_config"] is None
    assert set(t["executed"]["step_k"]) == {0}


def test_dynamic_arm_runs_the_schedule_for_the_batch_sizes_it_sees(cluster: dict[str, Any]) -> None:
    url = cluster["urls"]["dyn-single"]
    table = _table()
    alone = _complete(url, extra_body={"ignore_eos": True})
    t = alone["specdrill"]
    assert set(t["executed"]["step_batch_size"]) == {1} and set(t["executed"]["step_k"]) == {3}
    assert set(alone["metrics"]["speculative_decoding"]["per_step_drafted"]) == {3}
    assert t["resolved_speculative_config"]["num_speculative_tokens_per_batch_size"] == [
        [1, 2, 3],
        [3, 8, 1],
        [9, 512, 0],
    ]
    assert t["schedule_dropped"] is False

    # Staggered lengths: the batch climbs past 8 and drains back through 8..3 and 2..1.
    with ThreadPoolExecutor(12) as pool:
        bodies = list(
            pool.map(lambda i: _complete(url, max_tokens=20 + 8 * i, extra_body={"ignore_eos": True}), range(12))
        )
    seen_k: set[int] = set()
    for body in bodies:
        executed = body["specdrill"]["executed"]
        assert executed["step_k"] == [table[b] for b in executed["step_batch_size"]]
        seen_k |= set(executed["step_k"])
        drafted = body["metrics"]["speculative_decoding"].get("per_step_drafted", [])
        assert set(drafted) <= {1, 3}  # k = 0 steps carry no drafts and are omitted, as vLLM does
    assert {0, 1} <= seen_k  # twelve in flight crossed both boundaries


def test_data_parallel_arm_drops_the_schedule_and_runs_static_k(cluster: dict[str, Any]) -> None:
    url = cluster["urls"]["dyn-dp2"]
    # Serve's router picks between replicas by their queue lengths, probed and cached: nothing makes one burst of
    # 16 requests reach both ranks (CI once saw all 16 on one, on a loaded host). Bursts go on, a second apart,
    # until both ranks have answered (at most 6); every response of every burst is checked.
    bodies: list[dict[str, Any]] = []
    with ThreadPoolExecutor(16) as pool:
        for _ in range(6):
            bodies += pool.map(lambda _: _complete(url, max_tokens=48, extra_body={"ignore_eos": True}), range(16))
            if len({body["specdrill"]["replica_id"] for body in bodies}) == 2:
                break
            time.sleep(1.0)
    replicas = set()
    batch_sizes: set[int] = set()
    for body in bodies:
        t = body["specdrill"]
        assert t["schedule_dropped"] is True
        assert t["resolved_speculative_config"]["num_speculative_tokens_per_batch_size"] is None
        assert t["configured_speculative_config"]["num_speculative_tokens_per_batch_size"] == [
            [1, 2, 3],
            [3, 8, 1],
            [9, 512, 0],
        ]
        assert set(t["executed"]["step_k"]) == {3}
        batch_sizes |= set(t["executed"]["step_batch_size"])
        assert set(body["metrics"]["speculative_decoding"]["per_step_drafted"]) == {3}
        replicas.add(t["replica_id"])
    assert len(replicas) == 2  # two DP ranks served the traffic
    # Some steps ran batches of 3 or more, where the schedule says k = 1: still k = 3 (how each request's
    # batches overlap depends on timing; across 16 requests on two ranks some do).
    assert max(batch_sizes) >= 3


def test_telemetry_carries_placement_versions_and_timestamps(cluster: dict[str, Any]) -> None:
    t = _complete(cluster["urls"]["fixed3-single"])["specdrill"]
    for key in ("replica_id", "engine_id", "node_id", "node_ip", "topology", "versions", "configured_policy"):
        assert t[key], key
    assert {"specdrill", "ray", "engine"} <= set(t["versions"])
    ts = t["timestamps"]
    assert ts["received"] <= ts["first_scheduled"] <= ts["first_token"] <= ts["done"]
    assert t["queue_wait_s"] >= 0 and abs(ts["received"] - time.time()) < 60


def test_step_timeline_endpoint(cluster: dict[str, Any]) -> None:
    url = cluster["urls"]["dyn-single"]
    # Its own load: the steps it reads must not depend on which tests ran before it (alone it once saw 2 steps).
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _complete(url, max_tokens=16, extra_body={"ignore_eos": True}), range(4)))
    with urllib.request.urlopen(f"{url}/specdrill/timeline") as response:
        timeline = json.loads(response.read())
    table = _table()
    assert len(timeline["batch_size"]) > 10
    assert timeline["k"] == [table[b] for b in timeline["batch_size"]]
    assert timeline["end"] == sorted(timeline["end"])
    # What calibrate fits step times to: tokens computed, and KV tokens read (at least those computed).
    pairs = list(zip(timeline["kv_tokens"], timeline["batched_tokens"], strict=True))
    assert all(kv >= batched >= 1 for kv, batched in pairs)
    # Engine lag: one non-negative wall-clock delay per step, what the report holds the unit's latencies to.
    assert len(timeline["lag_s"]) == len(timeline["k"]) and min(timeline["lag_s"]) >= 0.0
    with urllib.request.urlopen(f"{url}/specdrill/timeline?since_step={len(timeline['k']) - 3}") as response:
        tail = json.loads(response.read())
        assert len(tail["k"]) == 3 and tail["lag_s"] == timeline["lag_s"][-3:]


def test_bad_requests_get_openai_errors(cluster: dict[str, Any]) -> None:
    import openai

    client = _client(cluster["urls"]["off-single"])
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=3, n=2)
    with pytest.raises(openai.BadRequestError, match="not served here"):
        client.completions.create(model="gpt-nothing", prompt="x", max_tokens=3)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)


def test_live_ray_metrics(cluster: dict[str, Any]) -> None:
    url = f"http://127.0.0.1:{cluster['metrics_port']}/metrics"
    deadline = time.monotonic() + 60
    text = ""
    wanted = ("specdrill_executed_k", "specdrill_running_batch", "specdrill_queue_length", 'arm="dyn-single"')
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url) as response:
            text = response.read().decode()
        if all(name in text for name in wanted):  # each replica's metrics reach the exporter on their own
            break
        time.sleep(1)
    assert "specdrill_executed_k" in text and "specdrill_queue_length" in text
    assert 'arm="dyn-single"' in text


def _cli(*args: str, address: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "RAY_ADDRESS": address}
    return subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip


def test_cli_deploy_and_teardown(cluster: dict[str, Any], tmp_path: Path) -> None:
    from ray import serve

    spec = _campaign(cluster["port"], name="clitest")
    spec["arms"] = [{"policy": "fixed3", "topology": "single"}]
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = _cli("deploy", str(path), address=cluster["gcs_address"])
    assert result.returncode == 0, result.stderr
    urls = json.loads(result.stdout)
    assert list(urls) == ["fixed3-single"]
    assert _complete(urls["fixed3-single"])["specdrill"]["arm"] == "fixed3-single"
    result = _cli("teardown", str(path), address=cluster["gcs_address"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"deleted": ["clitest.fixed3-single"]}
    assert "clitest.fixed3-single" not in serve.status().applications
    assert "simtest.dyn-single" in serve.status().applications  # other campaigns untouched


def test_failed_deploy_leaves_nothing_behind(cluster: dict[str, Any], tmp_path: Path) -> None:
    from ray import serve

    spec = _campaign(cluster["port"], name="failtest", resources={"gpus_per_engine": 1})
    spec["arms"] = [{"policy": "off", "topology": "single"}, {"policy": "fixed3", "topology": "single"}]
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = _cli("deploy", str(path), "--timeout", "8", address=cluster["gcs_address"])
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("specdrill: error:")]
    assert len(errors) == 1 and "no node of the cluster has a GPU" in errors[0]
    assert not [name for name in serve.status().applications if name.startswith("failtest.")]


def test_bad_campaign_is_refused_before_anything_deploys(cluster: dict[str, Any], tmp_path: Path) -> None:
    spec = _campaign(cluster["port"], name="badtest")
    spec["policies"]["dyn"] = "dynamic:3:2-8=3"
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = _cli("deploy", str(path), address=cluster["gcs_address"])
    assert result.returncode == 2
    assert result.stderr.strip().startswith("specdrill: error: campaign")
    assert "must start at 1" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_campaign_on_another_port_is_refused(cluster: dict[str, Any]) -> None:
    from orchestrator.execute.deploy import DeployError

    other = Campaign.model_validate(
        {**_campaign(free_port(), name="porttest"), "arms": [{"policy": "off", "topology": "single"}]}
    )
    with pytest.raises(DeployError, match=f"already listens on 127.0.0.1:{cluster['port']}"):
        deploy(other)


def test_continuous_usage_counts_the_tokens_of_every_chunk(cluster: dict[str, Any]) -> None:
    """vLLM's continuous_usage_stats: cumulative usage on every chunk, so multi-token chunks can be split."""
    client = _client(cluster["urls"]["fixed3-single"])
    stream = client.completions.create(
        model=MODEL, prompt="a b c d", max_tokens=40, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = [c.model_dump() for c in stream]
    cumulative = [c["usage"]["completion_tokens"] for c in chunks if c.get("usage") and c["choices"]]
    assert cumulative == sorted(cumulative) and cumulative[-1] == 40
    per_chunk = [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)]
    assert max(per_chunk) > 1  # speculation delivers several tokens per step
    assert all(c["usage"]["prompt_tokens"] == 4 for c in chunks if c.get("usage"))
    assert chunks[-1]["usage"]["completion_tokens"] == 40 and chunks[-1]["choices"] == []


def test_load_workers_on_ray_write_one_row_per_request(cluster: dict[str, Any], tmp_path: Path) -> None:
    from loadshapes.mixes import MixEntry, RequestMix
    from loadshapes.plan import Target, WorkerPlan, open_loop_schedule
    from loadshapes.shapes import Quiet
    from loadshapes.trace import read_traces
    from orchestrator.execute.load_workers import run_load

    root = tmp_path / "traces"
    plans = [
        WorkerPlan(
            campaign="simtest", run="r1", arm="dyn-single", policy=SCHEDULE, topology="single", shape_name="quiet",
            shape=Quiet(rate=10, duration_s=8), mix=RequestMix(entries=[MixEntry(workload="chat", weight=1)]),
            target=Target(base_url=cluster["urls"]["dyn-single"], model=MODEL), trace_root=str(root),
            worker=w, workers=2, seed=7, store_step_lists=True,  # the lists are optional since schema 2
        )
        for w in range(2)
    ]  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_load, plans, cpus_per_worker=0.5, workdir=str(tmp_path / "w"))
        metrics = ""
        while not running.done() and "specdrill_load_completions" not in metrics:
            time.sleep(1)
            with urllib.request.urlopen(f"http://127.0.0.1:{cluster['metrics_port']}/metrics") as response:
                metrics = response.read().decode()
        summaries = running.result()
    # Live progress reached Ray's metrics port while the load ran.
    assert "specdrill_load_completions" in metrics and 'arm="dyn-single"' in metrics
    table = read_traces(str(root))
    expected = sorted(plans[0].request_id(p.index) for plan in plans for p in open_loop_schedule(plan))
    assert sum(s.scheduled for s in summaries) == len(expected) == table.num_rows > 20
    assert sorted(table.column("request_id").to_pylist()) == expected
    assert set(table.column("status").to_pylist()) == {"ok"}
    assert {s.start_ns for s in summaries} == {summaries[0].start_ns}  # one common start
    assert all(s.node_id for s in summaries)
    rows = table.to_pylist()
    assert all(r["step_k"] and len(r["step_k"]) == len(r["step_batch_size"]) for r in rows)
    assert all(r["queue_wait_s"] is not None and r["server_received_ns"] >= r["sent_ns"] - 5_000_000 for r in rows)
    assert all(len(r["token_times_ns"]) == r["output_tokens"] for r in rows)
    assert {json.loads(r["resolved_speculative_config"])["num_speculative_tokens"] for r in rows} == {3}


def test_a_load_worker_killed_mid_run_loses_only_its_unflushed_rows(cluster: dict[str, Any], tmp_path: Path) -> None:
    import ray

    from loadshapes.mixes import MixEntry, RequestMix
    from loadshapes.plan import Target, WorkerPlan
    from loadshapes.shapes import Quiet
    from loadshapes.trace import read_traces
    from orchestrator.execute.load_workers import LoadWorkers, actor_name
    from orchestrator.rundir.layout import RunStore, Unit
    from orchestrator.rundir.unit_files import rows_on_disk

    root = tmp_path / "run"
    plans = [
        WorkerPlan(
            campaign="simtest", run="r1", arm="off-single", shape_name="quiet", shape=Quiet(rate=8, duration_s=14),
            mix=RequestMix(entries=[MixEntry(workload="chat", weight=1)]), flush_rows=5, flush_s=0.5,
            target=Target(base_url=cluster["urls"]["off-single"], model=MODEL), trace_root=str(root / "traces"),
            worker=w, workers=2, seed=3,
        )
        for w in range(2)
    ]  # fmt: skip
    workers = LoadWorkers(cpus_per_worker=0.5, workdir=str(tmp_path / "w"))
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(workers.run, plans)
        victim = None
        deadline = time.monotonic() + 60
        while victim is None and time.monotonic() < deadline:
            try:
                victim = ray.get_actor(actor_name(plans[1]))
            except ValueError:
                time.sleep(0.2)
        assert victim is not None
        progress = None
        while time.monotonic() < deadline + 60 and (progress is None or progress["statuses"].get("ok", 0) < 12):
            time.sleep(0.5)
            progress = ray.get(victim.progress.remote())
        ray.kill(victim)  # mid-run: some rows flushed (every 5), more still to come
        summaries = running.result(timeout=120)
    survivor, lost = summaries
    assert not survivor.lost, survivor.lost_reason
    assert lost.lost and lost.scheduled > 20
    assert survivor.rows_written == survivor.scheduled  # the other worker finished its share
    table = read_traces(str(root / "traces"))
    flushed = rows_on_disk(RunStore(str(root)), Unit(arm="off-single", shape="quiet", repeat=0), [1])
    assert 0 < flushed < lost.scheduled  # what it flushed survived; the rest is the gap
    assert table.num_rows == survivor.rows_written + flushed

    # The campaign goes on: the next unit gets a new actor in the lost one's slot, the survivor is reused.
    following = [p.model_copy(update={"shape_name": "next", "shape": Quiet(rate=8, duration_s=2)}) for p in plans]
    try:
        again = workers.run(following)
        assert not any(s.lost for s in again) and all(s.rows_written == s.scheduled for s in again)
        assert ray.get_actor(actor_name(plans[1], generation=1)) and ray.get_actor(actor_name(plans[0]))
    finally:
        workers.close()


def test_a_serve_replica_killed_mid_run_becomes_error_rows_and_a_marked_window(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    import threading

    import ray

    from loadshapes.trace import read_traces
    from orchestrator.execute.ray_executor import run_campaign
    from orchestrator.report.build import write_report

    output = tmp_path / "run"
    data = _campaign(cluster["port"], name="faulttest")
    data.update(
        policies={"off": "off"}, topologies={"single": "single"}, arms=[{"policy": "off", "topology": "single"}],
        shapes={"steady": {"kind": "quiet", "rate": 5, "duration_s": 24}}, output=str(output),
        load={"workers": 1, "drain_s": 30, "flush_rows": 5, "flush_s": 0.5},
        # Short chat turns finish within a second or two, so the kill comes early in the unit even on a slow
        # host; long reasoning turns are in flight when it comes.
        mix={"entries": [{"workload": "chat", "weight": 1}, {"workload": "reasoning", "weight": 1}]},
    )  # fmt: skip
    campaign = Campaign.model_validate(data)
    parts = output / "traces/arm=off-single/shape=steady"
    killed: list[str] = []
    killed_at: list[int] = []
    replaced_at: list[int] = []

    def kill_the_replica_mid_unit() -> None:
        deadline = time.monotonic() + 240
        while not list(parts.glob("*.parquet")) and time.monotonic() < deadline:  # the first rows measured
            time.sleep(0.2)
        for actor in ray.util.list_named_actors(all_namespaces=True):
            if actor["name"].startswith("SERVE_REPLICA::faulttest.off-single#"):
                ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
                killed.append(actor["name"])
                killed_at.append(time.time_ns())
        while not replaced_at and time.monotonic() < deadline:  # Serve starts a new replica (seconds on a busy host)
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
            if any(n.startswith("SERVE_REPLICA::faulttest.off-single#") and n not in killed for n in names):
                replaced_at.append(time.time_ns())
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_replica_mid_unit, daemon=True)
    killer.start()
    _, manifest = run_campaign(campaign)
    killer.join(10)
    assert killed, "no replica was killed"

    scheduled = manifest["units"]["off-single/steady/r0"]["scheduled"]
    # The worker's part files (5 rows each) were merged into one when the unit completed.
    marker = json.loads((output / "units/off-single/steady/r0.json").read_text())
    assert marker["trace_file"] and [p.name for p in parts.glob("*.parquet")] == [Path(marker["trace_file"]).name]
    table = read_traces(str(parts.parent.parent))
    assert table.num_rows == scheduled  # every request one row, errors included
    status = table.column("status").to_pylist()
    failed = [r for r in table.to_pylist() if r["status"] != "ok"]
    assert failed, "the replica's in-flight requests should have failed"
    assert all(r["error_class"] for r in failed)  # classified, with a message
    # The run went on: Serve restarted the replica and later requests succeeded.
    assert all(r["done_ns"] for r in failed)  # when each failure was seen
    first_failure = min(r["done_ns"] for r in failed)
    last_failure = max(r["done_ns"] for r in failed)
    ok_done = [r["done_ns"] for r in table.to_pylist() if r["status"] == "ok"]
    t0 = min(r["scheduled_ns"] for r in table.to_pylist())
    timeline = (f"killed at {[(t - t0) / 1e9 for t in killed_at]} s, replaced at "
                f"{[(t - t0) / 1e9 for t in replaced_at]} s, last request scheduled at "
                f"{(max(r['scheduled_ns'] for r in table.to_pylist()) - t0) / 1e9:.1f} s")  # fmt: skip
    assert replaced_at and replaced_at[0] < max(r["scheduled_ns"] for r in table.to_pylist()), timeline
    assert min(ok_done) < first_failure < last_failure < max(ok_done), timeline
    assert status.count("ok") > 10

    summary = write_report(str(output))
    windows = [w for w in summary.fault_windows if w.unit == "off-single/steady/r0"]
    assert windows and sum(w.failed for w in windows) == len(failed)
    print(*(w.message for w in windows), sep="\n")
    html = (output / "report.html").read_text()
    assert "Fault windows" in html and windows[0].message.split(":")[0] in html
