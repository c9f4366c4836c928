"""`specdrill compare` on runs made in real time: simulated arms on Ray Serve and an endpoint campaign (two null
servers someone else runs), as issue 36 asks of real-time, virtual-time and endpoint runs alike. Host timing
decides these runs' latencies, so what is asserted is what compare must say whatever the host did: a run against
itself, the same campaign in virtual time (paired across the modes, which it names), another traffic seed in
virtual time (unpaired), two endpoint runs of one campaign (paired)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from loadshapes.null_server import NullConfig, NullServer, ServerThread
from orchestrator.execute.ray_executor import run_campaign
from orchestrator.plan.campaign import Campaign
from orchestrator.report.build import write_report
from tests.orchestrator.compare.test_compare import compare, simulate
from tests.ray_helpers import free_port, local_ray
from tests.tiny_campaigns import EAGLE, sim_campaign

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# ~40 requests per arm at one offered rate: one offered-rate band with a verdict in each run. Not shorter: in
# virtual time, 30 requests (5 req/s for 6 s) or ~40 at 7-10 req/s leave the unpaired comparison's `off` cell not
# comparable.
HOLD = {"hold": {"kind": "quiet", "rate": 5, "duration_s": 8}}
# The same ~40 requests in half the time on the null servers, which keep up at any such rate (the simulated arms
# keep HOLD: its virtual-time twins are compared with it). Not shorter: with 2 s at 20 req/s, reruns of identical
# servers on a loaded host differed (2 false alarms in 6 cells in one run; 4 s units, none).
FAST_HOLD = {"hold": {"kind": "quiet", "rate": 10, "duration_s": 4}}
CHAT = {"entries": [{"workload": "chat", "weight": 1}]}


def simulated(port: int, seed: int) -> dict[str, Any]:
    """`off` and fixed k = 3 on the simulated EAGLE engine on Serve, slowed 2x so a busy host keeps pace."""
    return sim_campaign("revisit-real", **{
        "engine": {**EAGLE, "time_scale": 2.0}, "policies": {"off": "off", "fixed3": "fixed:3"},
        "serve": {"host": "127.0.0.1", "port": port}, "shapes": HOLD, "mix": CHAT, "seed": seed,
        "load": {"workers": 1, "drain_s": 10}, "warmup": {"requests": 2},
    })  # fmt: skip


def endpoint(urls: dict[str, str]) -> dict[str, Any]:
    return {
        "name": "revisit-endpoint", "engine": {"kind": "endpoint", "model": "null-model", "urls": urls},
        "policies": {"off": "off", "fixed3": "fixed:3"}, "topologies": {"single": "single"}, "shapes": FAST_HOLD,
        "mix": CHAT, "warmup": {"requests": 0},  # the null server only streams: nothing to read back from a warm-up
        "load": {"workers": 1, "drain_s": 10},
    }  # fmt: skip


def run_and_report(data: dict[str, Any], output: Path, address: str) -> Path:
    run_campaign(Campaign.model_validate({**data, "output": str(output)}), address=address)
    write_report(str(output))
    return output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A simulated real-time run (seed 0, its Serve port in "port") and two endpoint runs of one campaign, on one
    Ray."""
    root = tmp_path_factory.mktemp("compare-real")
    servers = {
        "off-single": ServerThread(NullServer(NullConfig(chunks=16, chunk_delay_s=0.02))),
        "fixed3-single": ServerThread(NullServer(NullConfig(chunks=16, chunk_delay_s=0.01))),
    }
    try:
        with local_ray(num_cpus=4) as info:
            address, port = str(info["gcs_address"]), free_port()
            made = {"real": run_and_report(simulated(port, 0), root / "real", address)}
            urls = {name: server.url for name, server in servers.items()}
            made |= {name: run_and_report(endpoint(urls), root / name, address) for name in RERUNS}
    finally:
        for server in servers.values():
            server.stop()
    yield {**made, "root": root, "port": port}


RERUNS = ("endpoint", "again", "third")  # one endpoint campaign run three times on the same two servers


def judged(found: Any) -> list[Any]:
    return [c for c in found.cells if c.verdict != "not_comparable"]


def test_a_real_time_run_compares_with_itself_and_with_virtual_time_runs_paired_and_unpaired(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    root, real = runs["root"], runs["real"]
    code, err, found = compare(capsys, str(real), str(real), "-o", str(root / "same"), "--fail-on", "any")
    assert code == 0 and found is not None and found.paired, err
    assert judged(found) and all(c.verdict == "no_change" for c in judged(found)), found.cells
    assert found.setup == [] and "No change in any of the" in found.answer

    # The same campaign and seed in virtual time sent the same requests: paired across the modes, which it names.
    # No gate here: the real-time run's engine runs on this host, whose own costs (HTTP streaming, Ray, the other
    # test worker's vLLM beside it) are in every step and every token, so speculation's benefit on this host may
    # differ from the simulator's either way (a clean-clone run under load: fixed3 0.72x, off 0.93x, benefit
    # 0.77x; alone: benefit within the margin). That is a finding about the host, not a false alarm; the gate's
    # false-alarm rate is held on reruns of identical servers (test_endpoint_runs_compare_request_by_request).
    # What compare must do across modes: pair the requests, name the mode as the set-up difference, and answer
    # speculation's benefit first and the engine's own change (off against itself) apart.
    virtual = simulate(capsys, root, "virtual", simulated(runs["port"], 0))
    code, err, found = compare(capsys, str(virtual), str(real), "-o", str(root / "virtual-out"))
    assert code == 0 and found is not None and found.paired, err
    assert [(d.what, d.baseline, d.candidate) for d in found.setup] == [("mode", "virtual", "real")]
    assert judged(found) and any(c.paired and c.pairs >= 20 for c in judged(found))
    assert found.benefit_changes and all(b.arm == "fixed3-single" for b in found.benefit_changes)
    assert found.answer.index("Speculation's benefit") < found.answer.index("The engine ")
    assert [e.arm for e in found.engine_changes] == ["off-single"]

    other = simulate(capsys, root, "virtual-seed1", simulated(runs["port"], 1))
    code, err, found = compare(capsys, str(real), str(other), "-o", str(root / "seed1-out"))
    assert code == 0 and found is not None, err
    assert not found.paired and "unpaired" in found.traffic and all(not c.paired for c in found.cells)
    assert judged(found) and all("unpaired, n = " in c.message for c in judged(found))
    assert {(d.what, d.baseline, d.candidate) for d in found.setup if d.what != "campaign fingerprint"} == {
        ("mode", "real", "virtual"), ("seed", "0", "1")}  # fmt: skip
    assert any(d.what == "campaign fingerprint" for d in found.setup)
    assert found.traffic_differences == ["seed (0 / 1)", "the engine is the same"]
    assert (root / "seed1-out" / "compare.html").read_text().count("<script") == 0


def test_endpoint_runs_compare_request_by_request(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    root, base, again = runs["root"], runs["endpoint"], runs["again"]
    code, err, found = compare(capsys, str(base), str(base), "-o", str(root / "endpoint-same"), "--fail-on", "any")
    assert code == 0 and found is not None and found.paired, err
    assert judged(found) and all(c.verdict == "no_change" for c in judged(found)), found.cells

    code, err, found = compare(capsys, str(base), str(again), "-o", str(root / "endpoint-again"), "--fail-on", "worse")
    assert code == 0 and found is not None and found.paired, err  # the same servers: speculation's benefit held
    assert not [d for d in found.setup if d.what.startswith("engine.")], found.setup  # the same servers
    assert judged(found) and all(c.paired for c in judged(found))
    assert (root / "endpoint-again" / "compare.html").read_text().count("<script") == 0


def test_paired_reruns_on_identical_servers_rarely_raise_a_false_alarm(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Three runs of one campaign on the same two servers, compared pair by pair in real time: nothing changed,
    so every cell said better or worse is a false alarm, and so is a failed gate on speculation's benefit."""
    root = runs["root"]
    cells = benefits = false_cells = false_benefits = 0
    for n, (a, b) in enumerate(combinations(RERUNS, 2)):
        code, err, found = compare(capsys, str(runs[a]), str(runs[b]), "-o", str(root / f"rerun-{n}"),
                                   "--fail-on", "worse")  # fmt: skip
        assert found is not None and found.paired, err
        cells += len(judged(found))
        false_cells += sum(c.verdict in ("worse", "better") for c in judged(found))
        comparable = [x for x in found.benefit_changes if x.verdict != "not_comparable"]
        benefits += len(comparable)
        false_benefits += sum(x.verdict in ("worse", "better") for x in comparable)
        print(f"{a} / {b}: exit {code}; {found.answer}")
    print(f"false alarms: {false_cells} of {cells} cells, {false_benefits} of {benefits} benefit cells")
    assert benefits >= 3 and cells >= 6
    assert false_benefits == 0 and false_cells == 0
