from __future__ import annotations

import asyncio

import numpy as np
import pytest

from loadshapes.arrivals import poisson_arrivals
from loadshapes.mixes import Fixed, Workload, builtin_workload
from orchestrator.virtual.experiments import make_requests
from serve_apps.policies import SINGLE, DynamicPolicy, FixedPolicy, OffPolicy, Topology
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.realtime import Finished, RealtimeEngine, TokenBatch
from serve_apps.sim.request import RequestRecord, SimRequest
from serve_apps.sim.virtual import run_open_loop

SCHEDULE = ((1, 8, 3), (9, 32, 1), (33, 512, 0))


def _run(profile: Profile, policy, rate: float, duration: float, *, seed: int = 3, topology=SINGLE, **wl):
    workload = builtin_workload("chat").model_copy(update=wl) if wl else builtin_workload("chat")
    requests = make_requests(workload, poisson_arrivals(rate, duration, seed=seed), seed=seed + 1)
    core = EngineCore(profile, policy.resolve(topology), seed=seed)
    run = run_open_loop(core, requests)
    return core, run


def test_every_request_gets_its_tokens_and_timestamps_are_monotone(eagle_profile: Profile) -> None:
    core, run = _run(eagle_profile, FixedPolicy(method="eagle", model="d", k=3), rate=20, duration=20)
    assert run.records and not run.unfinished
    for r in run.records:
        assert len(r.token_times) == r.output_tokens
        if r.finish_reason == "length":
            assert r.output_tokens == r.max_tokens
        else:
            assert r.output_tokens < r.max_tokens
        assert r.arrival <= r.first_scheduled < r.first_token <= r.finished
        assert np.all(np.diff(r.token_times) >= 0)
        assert r.token_times[0] == r.first_token and r.token_times[-1] == r.finished
    steps = core.steps.as_dict()
    assert np.all(steps["end"] > steps["start"])
    assert np.all(steps["start"][1:] >= steps["end"][:-1] - 1e-12)


def test_ignore_eos_runs_to_max_tokens(eagle_profile: Profile) -> None:
    _, run = _run(
        eagle_profile, FixedPolicy(method="eagle", model="d", k=3), rate=5, duration=10,
        ignore_eos=True, max_tokens=77,
    )  # fmt: skip
    assert {r.output_tokens for r in run.records} == {77}
    assert {r.finish_reason for r in run.records} == {"length"}


def test_natural_stop_before_max_tokens(eagle_profile: Profile) -> None:
    workload = Workload(name="w", category="chat", prompt_tokens=Fixed(value=50), output_tokens=Fixed(value=30),
                        max_tokens=100)  # fmt: skip
    requests = make_requests(workload, np.array([0.0, 0.01]), seed=1)
    core = EngineCore(eagle_profile, FixedPolicy(method="eagle", model="d", k=3).resolve(), seed=1)
    records = run_open_loop(core, requests).records
    assert [(r.output_tokens, r.finish_reason) for r in records] == [(30, "stop"), (30, "stop")]


def test_executed_k_follows_the_schedule_by_batch_size(eagle_profile: Profile) -> None:
    policy = DynamicPolicy(method="eagle", model="d", max_k=3, schedule=SCHEDULE)
    core, run = _run(eagle_profile, policy, rate=30, duration=20)
    table = policy.resolve().k_table(eagle_profile.limits.max_num_seqs)
    steps = core.steps.as_dict()
    assert np.array_equal(steps["k"], np.asarray(table)[steps["batch_size"]])
    assert {0, 1, 3} <= set(np.unique(steps["k"]).tolist())  # the load crossed the boundaries
    for r in run.records:
        assert np.array_equal(r.step_k, np.asarray(table)[r.step_batch_size])
        # EAGLE always drafts: what a step verifies is the k chosen in this request's previous step.
        decode = np.flatnonzero(r.step_drafted > 0)
        assert np.array_equal(r.step_drafted[decode], r.step_k[decode - 1])
        assert np.all(r.step_drafted[1:][r.step_k[:-1] == 0] == 0)


def test_data_parallel_arm_runs_the_static_k(eagle_profile: Profile) -> None:
    policy = DynamicPolicy(method="eagle", model="d", max_k=3, schedule=SCHEDULE)
    core, _ = _run(eagle_profile, policy, rate=30, duration=10, topology=Topology(kind="data_parallel", size=2))
    assert set(np.unique(core.steps.column("k")).tolist()) == {3}
    assert core.speculation.schedule_dropped


def test_queue_builds_under_overload(eagle_profile: Profile) -> None:
    core, run = _run(eagle_profile, OffPolicy(), rate=150, duration=20)
    waits = np.array([r.queue_wait for r in sorted(run.records, key=lambda r: r.arrival)])
    first, last = waits[: len(waits) // 5], waits[-len(waits) // 5 :]
    assert np.median(last) > 10 * max(np.median(first), 1e-3)
    assert core.steps.column("waiting").max() > 100


def test_kv_pressure_preempts_and_still_finishes(eagle_profile: Profile) -> None:
    small = eagle_profile.model_copy(
        update={"limits": eagle_profile.limits.model_copy(update={"kv_cache_tokens": 6000})}
    )
    core, run = _run(small, FixedPolicy(method="eagle", model="d", k=3), rate=20, duration=10)
    assert core.num_preemptions > 0
    assert not run.unfinished
    assert any(r.preemptions for r in run.records)
    assert all(len(r.token_times) == r.output_tokens for r in run.records)
    assert core.free_blocks == core.total_blocks


def test_vllm_style_metrics_omit_steps_without_drafts(ngram_profile: Profile) -> None:
    policy = DynamicPolicy(method="ngram", max_k=3, schedule=((1, 4, 3), (5, 512, 0)))
    _, run = _run(ngram_profile, policy, rate=20, duration=10)
    for r in run.records:
        m = r.spec_decode_metrics()
        assert m is not None
        assert m["num_spec_steps"] == int((r.step_drafted > 0).sum()) == sum(m["acceptance_histogram"])
        assert len(m.get("per_step_drafted", [])) == m["num_spec_steps"]
        assert all(d > 0 for d in m.get("per_step_drafted", []))
        assert m["num_draft_tokens"] == int(r.step_drafted.sum())
        assert len(r.step_k) >= m["num_spec_steps"]  # k = 0 steps are kept in our own per-step record
    off = _run(ngram_profile, OffPolicy(), rate=5, duration=5)[1].records[0]
    assert off.spec_decode_metrics() is None


def test_deterministic_for_a_seed(eagle_profile: Profile) -> None:
    policy = FixedPolicy(method="eagle", model="d", k=3)
    a = _run(eagle_profile, policy, rate=20, duration=10)[1].records
    b = _run(eagle_profile, policy, rate=20, duration=10)[1].records
    assert [(r.request_id, r.finished, r.output_tokens) for r in a] == [
        (r.request_id, r.finished, r.output_tokens) for r in b
    ]


def test_windowed_and_stepwise_agree_statistically(eagle_profile: Profile) -> None:
    policy = FixedPolicy(method="eagle", model="d", k=3)
    results = []
    for window in (1, 256):
        workload = builtin_workload("chat")
        requests = make_requests(workload, poisson_arrivals(10, 60, seed=5), seed=6)
        core = EngineCore(eagle_profile, policy.resolve(), seed=7, max_window=window)
        records = run_open_loop(core, requests).records
        results.append(
            (
                np.mean([r.tpot for r in records]),
                np.mean([r.spec_decode_metrics()["mean_acceptance_length"] for r in records]),
            )
        )
    (tpot_a, al_a), (tpot_b, al_b) = results
    assert abs(tpot_a - tpot_b) / tpot_a < 0.03
    assert abs(al_a - al_b) < 0.05


def test_oversized_request_is_refused(eagle_profile: Profile) -> None:
    core = EngineCore(eagle_profile, OffPolicy().resolve(), seed=0)
    with pytest.raises(ValueError, match="KV blocks"):
        core.add_request(SimRequest("big", "chat", 10**6, 10, 0.0))


def test_realtime_engine_streams_tokens_in_wall_time(eagle_profile: Profile) -> None:
    policy = DynamicPolicy(method="eagle", model="d", max_k=3, schedule=((1, 2, 3), (3, 512, 1)))

    async def scenario() -> list[tuple[int, list[float], RequestRecord]]:
        engine = RealtimeEngine(EngineCore(eagle_profile, policy.resolve(), seed=1), time_scale=3.0)

        async def one(i: int) -> tuple[int, list[float], RequestRecord]:
            count, times = 0, []
            async for item in engine.generate(SimRequest(f"r{i}", "chat", 64, 40, 0.0)):
                if isinstance(item, TokenBatch):
                    count += item.count
                    times.append(item.time)
                else:
                    assert isinstance(item, Finished)
                    return count, times, item.record
            raise AssertionError("stream ended without Finished")

        try:
            return await asyncio.gather(*(one(i) for i in range(4)))
        finally:
            await engine.stop()

    for count, times, record in asyncio.run(scenario()):
        assert count == record.output_tokens == 40
        assert times == sorted(times)
        assert record.first_token == times[0] and record.finished == times[-1]
        assert record.finished - record.arrival > 3.0 * 0.005 * 10  # dilated: >= 10 steps of >= 5 ms each
        table = np.asarray(policy.resolve().k_table(eagle_profile.limits.max_num_seqs))
        assert np.array_equal(record.step_k, table[record.step_batch_size])
        assert 1 in record.step_k  # four requests in flight -> batch 3-4 -> k = 1


def test_step_durations_follow_the_profile_cost_model(eagle_profile: Profile) -> None:
    policy = DynamicPolicy(method="eagle", model="d", max_k=3, schedule=SCHEDULE)
    core, _ = _run(eagle_profile, policy, rate=30, duration=10)
    s = core.steps.as_dict()
    v, d = eagle_profile.verify, eagle_profile.draft
    verify = v.per_kv_token * s["kv_tokens"] + v.per_batched_token * s["batched_tokens"] + v.fixed
    draft = np.where(
        s["k"] > 0,
        d.per_kv_token * s["kv_tokens"] + d.per_draft_token * s["k"] + d.fixed,
        d.idle_fixed + d.idle_per_request * s["batch_size"],
    )
    np.testing.assert_allclose(s["end"] - s["start"], verify + draft + eagle_profile.step_overhead, rtol=1e-9)
    off_core, _ = _run(eagle_profile, OffPolicy(), rate=30, duration=10)
    o = off_core.steps.as_dict()
    expected = v.per_kv_token * o["kv_tokens"] + v.per_batched_token * o["batched_tokens"] + v.fixed
    np.testing.assert_allclose(o["end"] - o["start"], expected + eagle_profile.step_overhead, rtol=1e-9)
    assert np.all(o["batched_tokens"] >= o["batch_size"])


def test_ngram_draft_costs_a_fraction_of_verify(ngram_profile: Profile) -> None:
    core, _ = _run(ngram_profile, FixedPolicy(method="ngram", k=3), rate=10, duration=5)
    s = core.steps.as_dict()
    v = ngram_profile.verify
    verify = v.per_kv_token * s["kv_tokens"] + v.per_batched_token * s["batched_tokens"] + v.fixed
    expected = verify * (1 + ngram_profile.draft.fraction) + ngram_profile.step_overhead
    np.testing.assert_allclose(s["end"] - s["start"], expected, rtol=1e-9)
