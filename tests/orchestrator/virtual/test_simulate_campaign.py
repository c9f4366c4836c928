"""simulate_campaign: `specdrill run` in virtual time writes the run directory the real run writes."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from loadshapes.plan import open_loop_schedule
from loadshapes.sse import StreamResult, latency_columns
from loadshapes.trace import STEP_LIST_COLUMNS, TraceWriter, read_traces, step_summaries
from orchestrator.plan.campaign import Campaign, CampaignError
from orchestrator.rundir.layout import MANIFEST, RunStore, Unit, UnitResult
from orchestrator.rundir.manifest import plans_for, units_of
from orchestrator.virtual.arrays import spec_arrays
from orchestrator.virtual.campaign import simulate_campaign
from orchestrator.virtual.executor import unit_starts
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.request import SimRequest
from serve_apps.sim.virtual import run_open_loop
from tests.tiny_campaigns import four_arms

MIX = {
    "entries": [
        {
            "workload": {
                "name": "short-chat", "category": "chat",
                "prompt_tokens": {"kind": "lognormal", "median": 128, "sigma": 0.5, "low": 16, "high": 1024},
                "output_tokens": {"kind": "lognormal", "median": 48, "sigma": 0.4, "low": 8, "high": 96},
                "max_tokens": 96,
            },
            "weight": 3,
        },
        {
            "workload": {
                "name": "short-editing", "category": "editing",
                "prompt_tokens": {"kind": "lognormal", "median": 160, "sigma": 0.4, "low": 32, "high": 1024},
                "output_tokens": {"kind": "lognormal", "median": 64, "sigma": 0.3, "low": 16, "high": 96},
                "max_tokens": 96,
            },
            "weight": 1,
        },
    ]
}  # fmt: skip
SCHEDULE = [[1, 8, 3], [9, 24, 1], [25, 512, 0]]


def campaign_data(output: Path, **changes: Any) -> dict[str, Any]:
    """The quickstart campaign with short shapes: seconds of traffic, a ramp that crosses batch size 8."""
    return four_arms("virtual-test", **{
        "policies": {"off": "off", "fixed3": "fixed:3", "dyn": "dynamic:3:1-8=3,9-24=1,25-512=0"},
        "shapes": {
            "quiet": {"kind": "quiet", "rate": 2, "duration_s": 3},
            "ramp": {"kind": "ramp", "rate_from": 4, "rate_to": 60, "duration_s": 5},
        },
        "mix": MIX, "load": {"workers": 2, "drain_s": 20}, "output": str(output), **changes,
    })  # fmt: skip


def traces_by_id(root: str) -> pa.Table:
    table = read_traces(f"{root}/traces")
    return table.take(pc.sort_indices(table, [("request_id", "ascending")]))


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    return Campaign.model_validate(campaign_data(tmp_path_factory.mktemp("virtual") / "run"))


@pytest.fixture(scope="module")
def simulated(campaign: Campaign) -> tuple[RunStore, dict[str, Any]]:
    return simulate_campaign(campaign)


def merged_schedule(campaign: Campaign, unit: Unit, run: str, traces: str) -> list[tuple[str, float, int, Any]]:
    """What the Locust workers send for this unit: every worker's open_loop_schedule, by request index."""
    arm = next(a for a in campaign.arms() if a.name == unit.arm)
    items = []
    for plan in plans_for(campaign, arm, unit, run=run, url="http://unused", traces=traces):
        items += [(plan.request_id(p.index), p.offset_s, plan.worker, p) for p in open_loop_schedule(plan)]
    return sorted(items, key=lambda item: item[3].index)


def worker_schema(root: Path) -> pa.Schema:
    writer = TraceWriter(str(root / "worker"), writer_id="a-s-r0-w0")
    writer.append({"campaign": "c", "run": "r", "arm": "a", "shape": "s", "request_id": "a:s:0:0", "repeat": 0,
                   "request_index": 0, "scheduled_ns": 1, "status": "ok"})  # fmt: skip
    writer.close()
    return read_traces(str(root / "worker")).schema


def test_rows_are_the_scheduled_requests_of_every_unit(
    campaign: Campaign, simulated: tuple[RunStore, dict[str, Any]], tmp_path: Path
) -> None:
    store, manifest = simulated
    table = read_traces(store.traces)
    assert table.schema.equals(worker_schema(tmp_path))  # what the load worker's files read back as
    assert manifest["mode"] == "virtual"
    for arm in campaign.arms():
        for unit in units_of(campaign, arm):
            marker = UnitResult.model_validate(store.read_json(store.unit_marker(unit)))
            rows = table.filter(pc.and_(pc.equal(table["arm"], unit.arm), pc.equal(table["shape"], unit.shape)))
            rows = rows.take(pc.sort_indices(rows, [("scheduled_ns", "ascending"), ("request_id", "ascending")]))
            expected = merged_schedule(campaign, unit, manifest["run"], store.traces)
            assert rows.num_rows == marker.rows == marker.scheduled == len(expected) > 0
            assert manifest["units"][unit.key]["rows"] == len(expected)
            ids = rows["request_id"].to_pylist()
            assert sorted(ids) == sorted(e[0] for e in expected)
            by_id = {e[0]: e for e in expected}
            offsets = [int(ns) - marker.start_ns for ns in rows["scheduled_ns"].to_pylist()]
            assert offsets == [round(by_id[i][1] * 1e9) for i in ids]
            assert rows["worker"].to_pylist() == [by_id[i][2] for i in ids]
            # The planning keys: pairing key, the unit's clock and the shape's rate there, no id parsing needed.
            assert rows["request_index"].to_pylist() == [int(i.rsplit(":", 1)[1]) for i in ids]
            assert set(rows["repeat"].to_pylist()) == {unit.repeat}
            assert set(rows["unit_start_ns"].to_pylist()) == {marker.start_ns}
            assert rows["offset_s"].to_pylist() == [by_id[i][1] for i in ids]
            shape = campaign.shapes[unit.shape]
            assert rows["offered_rate_rps"].to_pylist() == shape.rate_at(np.array([by_id[i][1] for i in ids])).tolist()
            assert rows["phase"].to_pylist() == [by_id[i][3].phase for i in ids]
            assert rows["category"].to_pylist() == [by_id[i][3].spec.category for i in ids]
            assert rows["prompt_sha256"].to_pylist() == [by_id[i][3].prompt_sha256 for i in ids]
            assert set(rows["status"].to_pylist()) == {"ok"}
            assert rows["sent_ns"].to_pylist() == rows["scheduled_ns"].to_pylist()
            assert set(rows["send_lateness_ns"].to_pylist()) == {0}
            assert {w.worker for w in marker.workers} == {0, 1}
            assert sum(w.rows_written for w in marker.workers) == marker.rows
            assert all(not w.saturated and w.node_id == "virtual" for w in marker.workers)
            # Only writer w0's files, so RunStore.remove_partial finds them.
            parts = [Path(f).name for w in marker.workers for f in w.files]
            assert parts and all(p.startswith(unit.part_prefix + "0-") for p in parts)


def test_units_do_not_overlap_in_virtual_time(campaign: Campaign, simulated: tuple[RunStore, dict[str, Any]]) -> None:
    store, _ = simulated
    markers = sorted(
        (UnitResult.model_validate(store.read_json(store.unit_marker(u))) for a in campaign.arms()
         for u in units_of(campaign, a)),
        key=lambda m: m.start_ns,
    )  # fmt: skip
    for before, after in itertools.pairwise(markers):
        assert before.end_ns < after.start_ns
    assert [m.start_ns for m in markers] == sorted(unit_starts(campaign).values())


def test_every_arm_gets_the_same_requests(campaign: Campaign, simulated: tuple[RunStore, dict[str, Any]]) -> None:
    store, _ = simulated
    table = read_traces(store.traces)
    for shape in campaign.shapes:
        seen = []
        for arm in campaign.arms():
            rows = table.filter(pc.and_(pc.equal(table["arm"], arm.name), pc.equal(table["shape"], shape)))
            pairs = sorted(
                (rid.split(":", 1)[1], sha, ns)
                for rid, sha, ns in zip(rows["request_id"].to_pylist(), rows["prompt_sha256"].to_pylist(),
                                        rows["prompt_tokens"].to_pylist(), strict=True)
            )  # fmt: skip
            seen.append(pairs)
        assert all(s == seen[0] for s in seen[1:])


def test_same_campaign_same_traces(
    campaign: Campaign, simulated: tuple[RunStore, dict[str, Any]], tmp_path: Path
) -> None:
    store, manifest = simulated
    again, manifest2 = simulate_campaign(campaign, output=str(tmp_path / "again"))
    assert manifest2["run"] != manifest["run"]
    first, second = traces_by_id(store.root), traces_by_id(again.root)
    assert first.drop_columns(["run"]).equals(second.drop_columns(["run"]))
    for path in sorted(Path(store.timelines).rglob("*.parquet")):
        twin = Path(again.timelines) / path.relative_to(store.timelines)
        assert pq.read_table(path).equals(pq.read_table(twin))


def test_latency_columns_are_computed_as_the_load_worker_does(simulated: tuple[RunStore, dict[str, Any]]) -> None:
    store, _ = simulated
    rows = read_traces(store.traces).slice(0, 300).to_pylist()
    for row in rows:
        result = StreamResult(token_times_ns=row["token_times_ns"])
        expected = latency_columns(row["scheduled_ns"], result, row["done_ns"])
        assert {k: row[k] for k in expected} == expected
        assert row["output_tokens"] == len(row["token_times_ns"])
        assert row["server_done_ns"] == row["done_ns"] == row["token_times_ns"][-1]
        assert row["server_received_ns"] <= row["server_first_scheduled_ns"] <= row["server_first_token_ns"]


def test_spec_columns_match_spec_decode_metrics(eagle_profile: Profile) -> None:
    from serve_apps.policies import parse_policy

    policy = parse_policy("dynamic:3:1-4=3,5-512=1", default_method="eagle", default_model="drafter")
    core = EngineCore(eagle_profile, policy.resolve(), seed=3)
    requests = [
        SimRequest(request_id=f"r{i}", category=("chat", "editing")[i % 2], prompt_tokens=100 + i, max_tokens=40,
                   arrival=i * 0.01, stop_at=10 + i)
        for i in range(40)
    ]  # fmt: skip
    records = run_open_loop(core, requests).records
    arrays = spec_arrays(records)
    offset = 0
    for i, record in enumerate(records):
        metrics = record.spec_decode_metrics()
        assert metrics is not None
        assert arrays["mean_acceptance_length"][i] == metrics["mean_acceptance_length"]
        steps = int(arrays["steps"][i])
        assert steps == metrics["num_spec_steps"]
        drafted = arrays["per_step_drafted"][offset : offset + steps].tolist()
        accepted = arrays["per_step_accepted"][offset : offset + steps].tolist()
        assert drafted == metrics.get("per_step_drafted", [])
        assert accepted == metrics.get("per_step_accepted", [])
        offset += steps


def _arm_rows(store: RunStore, arm: str) -> pa.Table:
    table = read_traces(store.traces)
    return table.filter(pc.equal(table["arm"], arm))


def test_dynamic_arm_runs_its_schedule(campaign: Campaign, simulated: tuple[RunStore, dict[str, Any]]) -> None:
    store, manifest = simulated
    arm = next(a for a in campaign.arms() if a.name == "dyn-single")
    dense = np.asarray(arm.policy.resolve(arm.topology).k_table(512))
    rows = _arm_rows(store, "dyn-single")
    # The per-step lists are off by default: every row has its summaries, the timeline has the steps.
    assert rows["step_batch_size"].null_count == rows["step_k"].null_count == rows.num_rows
    assert rows["engine_steps"].null_count == 0 and pc.min(rows["engine_steps"]).as_py() > 0
    assert set(rows["schedule_dropped"].to_pylist()) == {False}
    resolved = json.loads(rows["resolved_speculative_config"][0].as_py())
    assert resolved["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert manifest["arms"]["dyn-single"]["schedule_dropped"] is False
    timeline = pq.read_table(f"{store.timelines}/arm=dyn-single/shape=ramp/r0.parquet")
    assert (timeline["k"].to_numpy() == dense[timeline["batch_size"].to_numpy()]).all()
    assert {1, 3} <= set(timeline["k"].to_pylist())  # the ramp crossed batch size 8
    assert set(timeline["engine_id"].to_pylist()) == {"dyn-single-sim-0"}


def test_data_parallel_arm_runs_static_k(simulated: tuple[RunStore, dict[str, Any]]) -> None:
    store, manifest = simulated
    rows = _arm_rows(store, "dyn-dp2")
    timeline = pq.read_table(f"{store.timelines}/arm=dyn-dp2/shape=ramp/r0.parquet")
    assert set(timeline["k"].to_pylist()) == {3}
    assert pc.max(timeline["batch_size"]).as_py() > 8  # where the schedule would have asked for k = 1
    assert pc.max(rows["step_batch_max"]).as_py() > 8  # and the rows' summaries say so too
    assert set(rows["schedule_dropped"].to_pylist()) == {True}
    assert json.loads(rows["resolved_speculative_config"][0].as_py())["num_speculative_tokens_per_batch_size"] is None
    assert set(rows["engine_id"].to_pylist()) == {"dyn-dp2-sim-0", "dyn-dp2-sim-1"}
    entry = manifest["arms"]["dyn-dp2"]
    assert entry["schedule_dropped"] is True
    assert entry["configured_speculative_config"]["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert entry["url"] == "virtual://dyn-dp2" and entry["engine_kind"] == "simulated"
    # Round-robin: request i of the shape went to rank i mod 2.
    for rid, engine in zip(rows["request_id"].to_pylist(), rows["engine_id"].to_pylist(), strict=True):
        assert engine.endswith(f"-{int(rid.rsplit(':', 1)[1]) % 2}")


def test_each_data_parallel_engine_writes_its_own_rank(simulated: tuple[RunStore, dict[str, Any]]) -> None:
    """A DP group's ranks are told apart by dp_rank in the timeline (as vLLM's replica reports them); a single
    engine is rank 0."""
    store, _ = simulated
    timeline = pq.read_table(f"{store.timelines}/arm=dyn-dp2/shape=ramp/r0.parquet")
    ranks = dict(zip(timeline["engine_id"].to_pylist(), timeline["dp_rank"].to_pylist(), strict=True))
    assert ranks == {"dyn-dp2-sim-0": 0, "dyn-dp2-sim-1": 1}
    single = pq.read_table(f"{store.timelines}/arm=dyn-single/shape=ramp/r0.parquet")
    assert set(single["dp_rank"].to_pylist()) == {0}


def test_off_arm_reports_no_speculation(simulated: tuple[RunStore, dict[str, Any]]) -> None:
    store, _ = simulated
    rows = _arm_rows(store, "off-single")
    assert rows["mean_acceptance_length"].null_count == rows.num_rows
    assert rows["per_step_drafted"].null_count == rows.num_rows
    assert rows["resolved_speculative_config"].null_count == rows.num_rows
    assert set(rows["step_k_sum"].to_pylist()) == {0} and set(rows["drafted_tokens"].to_pylist()) == {0}


def test_step_lists_when_asked_for_agree_with_the_summaries(tmp_path: Path) -> None:
    data = campaign_data(tmp_path / "run", load={"workers": 2, "drain_s": 20, "store_step_lists": True})
    data["shapes"] = {"ramp": data["shapes"]["ramp"]}
    store, _ = simulate_campaign(Campaign.model_validate(data))
    rows = read_traces(store.traces).to_pylist()
    assert rows and all(r["step_batch_size"] for r in rows)
    for row in rows:
        expected = step_summaries(*(row[name] for name in STEP_LIST_COLUMNS))
        summary = {k: row[k] for k in expected}
        assert summary == pytest.approx(expected, rel=1e-12)


def test_resume_skips_complete_units_and_redoes_a_partial_one(
    campaign: Campaign, simulated: tuple[RunStore, dict[str, Any]], tmp_path: Path
) -> None:
    store, _ = simulated
    copy = tmp_path / "copy"
    shutil.copytree(store.root, copy)
    copied = RunStore(str(copy))
    redo = Unit(arm="dyn-single", shape="ramp", repeat=0)
    (copy / copied.unit_marker(redo)).unlink()  # as if the run died after writing the unit's rows
    before = {p.relative_to(copy): p.stat().st_mtime_ns for p in copy.rglob("*.parquet")}
    again, manifest = simulate_campaign(campaign, output=str(copy))
    assert manifest["resumed"] == 1
    after = {p.relative_to(copy): p.stat().st_mtime_ns for p in copy.rglob("*.parquet")}
    changed = {str(p) for p in set(before) ^ set(after)} | {str(p) for p in before if after.get(p) != before[p]}
    assert changed and all("arm=dyn-single/shape=ramp" in p for p in changed)
    table = read_traces(again.traces)
    rows = table.filter(pc.and_(pc.equal(table["arm"], "dyn-single"), pc.equal(table["shape"], "ramp")))
    ids = rows["request_id"].to_pylist()
    assert len(ids) == len(set(ids)) == UnitResult.model_validate(again.read_json(again.unit_marker(redo))).scheduled
    assert traces_by_id(str(copy)).drop_columns(["run"]).equals(traces_by_id(store.root).drop_columns(["run"]))


def test_engine_kind_vllm_is_refused(tmp_path: Path) -> None:
    data = campaign_data(tmp_path / "run", engine={"kind": "vllm", "model": "some/model"},
                         policies={"off": "off"}, topologies={"single": "single"}, arms=None)  # fmt: skip
    with pytest.raises(CampaignError) as caught:
        simulate_campaign(Campaign.model_validate(data))
    message = str(caught.value)
    assert "\n" not in message and "simulated" in message and "vllm" in message
    assert not (tmp_path / "run" / MANIFEST).exists()


def test_closed_loop_keeps_its_users_busy_until_the_duration(tmp_path: Path) -> None:
    data = campaign_data(
        tmp_path / "run", arms=[{"policy": "off", "topology": "single"}, {"policy": "fixed3", "topology": "dp2"}],
        shapes={"users": {"kind": "concurrency", "users": 5, "duration_s": 2}}, load={"workers": 2, "drain_s": 5},
    )  # fmt: skip
    store, _ = simulate_campaign(Campaign.model_validate(data))
    marker = UnitResult.model_validate(store.read_json(store.unit_marker(Unit(arm="fixed3-dp2", shape="users",
                                                                              repeat=0))))  # fmt: skip
    rows = read_traces(store.traces).filter(pc.equal(pc.field("arm"), "fixed3-dp2"))
    assert rows.num_rows == marker.rows == marker.scheduled > 5
    assert set(rows["status"].to_pylist()) == {"ok"}
    index = [int(r.rsplit(":", 1)[1]) for r in rows["request_id"].to_pylist()]
    assert len(set(index)) == len(index)
    # A worker numbers its requests w, w + W, ...; the five users start together at the unit's start.
    assert all(i % 2 == w for i, w in zip(index, rows["worker"].to_pylist(), strict=True))
    offsets = (rows["scheduled_ns"].to_numpy() - marker.start_ns) / 1e9
    assert sorted(i for i, t in zip(index, offsets, strict=True) if t == 0) == [0, 1, 2, 3, 4]
    assert offsets.max() < 2.0
    # Never more than five requests in flight.
    begin, end = rows["scheduled_ns"].to_numpy(), rows["done_ns"].to_numpy()
    in_flight = [int(((begin <= t) & (end > t)).sum()) for t in begin]
    assert max(in_flight) <= 5
    assert sum(w.max_in_flight for w in marker.workers) <= 5


def test_unfinished_requests_are_cancelled_and_late_ones_time_out(tmp_path: Path) -> None:
    data = campaign_data(
        tmp_path / "run", arms=[{"policy": "off", "topology": "single"}],
        shapes={"burst": {"kind": "quiet", "rate": 200, "duration_s": 2}},
        load={"workers": 1, "drain_s": 0.5, "request_timeout_s": 0.8},
    )  # fmt: skip
    store, _ = simulate_campaign(Campaign.model_validate(data))
    rows = read_traces(store.traces)
    marker = UnitResult.model_validate(store.read_json(store.unit_marker(Unit(arm="off-single", shape="burst",
                                                                              repeat=0))))  # fmt: skip
    assert rows.num_rows == marker.scheduled
    statuses = rows["status"].to_pylist()
    assert {"ok", "timeout", "cancelled"} <= set(statuses)
    for row in rows.to_pylist():
        if row["status"] == "cancelled":
            assert row["error_class"] == "drain_timeout" and row["sent_ns"] is None
            assert row["scheduled_ns"] + 0.8e9 > marker.end_ns  # its deadline had not passed when the worker stopped
        elif row["status"] == "timeout":
            assert row["done_ns"] is None and row["error_class"] == "timeout"
            assert all(t <= row["scheduled_ns"] + 0.8e9 for t in row["token_times_ns"] or [])
            assert row["output_tokens"] == (len(row["token_times_ns"]) if row["token_times_ns"] else None)
        else:
            assert row["e2e_s"] <= 0.8 and row["done_ns"] <= marker.end_ns


@pytest.mark.parametrize("repeat_traffic", ["fresh", "same"])
def test_repeat_traffic_replays_repeat_zero_or_draws_anew(tmp_path: Path, repeat_traffic: str) -> None:
    data = campaign_data(tmp_path / "run", repeats=2, load={"workers": 2, "drain_s": 20,
                                                            "repeat_traffic": repeat_traffic})  # fmt: skip
    data["arms"] = [{"policy": "off", "topology": "single"}, {"policy": "fixed3", "topology": "single"}]
    store, _ = simulate_campaign(Campaign.model_validate(data))
    table = read_traces(store.traces)
    for arm, shape in itertools.product(["off-single", "fixed3-single"], ["quiet", "ramp"]):
        sent = []
        for repeat in (0, 1):
            rows = table.filter(pc.and_(pc.and_(pc.equal(table["arm"], arm), pc.equal(table["shape"], shape)),
                                        pc.equal(table["repeat"], repeat)))  # fmt: skip
            rows = rows.take(pc.sort_indices(rows, [("request_index", "ascending")]))
            assert rows.num_rows > 0
            sent.append([rows[c].to_pylist() for c in ("offset_s", "prompt_sha256", "prompt_tokens", "category")])
        # The two repeats are two units either way (their own rows and ids); only what they send differs.
        if repeat_traffic == "same":
            assert sent[0] == sent[1]
        else:
            assert sent[0][0] != sent[1][0] and sent[0][1] != sent[1][1]
