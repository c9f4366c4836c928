"""TensorRT-LLM's draft_len_schedule (both key semantics), max_concurrency and acceptance gate, replayed against
expectations worked by hand from its code (citations in serve_apps/sim/rules/trtllm_schedule.py, trtllm_gate.py),
and the floor-0 fault (bug #16888) planted in the simulated engine."""

from __future__ import annotations

import numpy as np
import pytest

from loadshapes.arrivals import poisson_arrivals
from loadshapes.mixes import builtin_workload
from orchestrator.virtual.experiments import make_requests
from serve_apps.policies import PolicyError, parse_policy
from serve_apps.policies_trtllm import TrtllmSchedulePolicy
from serve_apps.resolved import GateRule
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.request import SimRequest
from serve_apps.sim.rules.trtllm_gate import replay_gate
from serve_apps.sim.rules.trtllm_schedule import max_concurrency_table, schedule_k
from serve_apps.sim.virtual import run_open_loop


def _parse(text: str):
    return parse_policy(text, default_method="eagle", default_model="d")


def test_lower_bound_keys_the_two_model_reading() -> None:
    # {1: 4, 4: 2, 8: 0}, largest key <= batch (bisect_right - 1): 1-3 -> 4, 4-7 -> 2, 8+ -> 0.
    schedule = {1: 4, 4: 2, 8: 0}
    assert [schedule_k(schedule, "lower_bounds", b) for b in (1, 3, 4, 7, 8, 100)] == [4, 4, 2, 2, 0, 0]


def test_upper_bound_keys_the_one_model_reading() -> None:
    # {4: 4, 8: 2, 32: 1}, smallest key >= batch (bisect_left), none -> 0: 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0.
    schedule = {4: 4, 8: 2, 32: 1}
    assert [schedule_k(schedule, "upper_bounds", b) for b in (1, 4, 5, 8, 9, 32, 33)] == [4, 4, 2, 2, 1, 1, 0]
    # The same dict read the other way gives another policy: lower bounds start at key 4, so 1-3 -> 0.
    assert [schedule_k(schedule, "lower_bounds", b) for b in (1, 4, 5, 9, 33)] == [0, 4, 4, 2, 1]


def test_the_schedule_is_named_and_validated_as_trtllm() -> None:
    policy = _parse("trtllm_schedule:upper_bounds:4:4=4,8=2,32=1")
    assert isinstance(policy, TrtllmSchedulePolicy) and policy.resolve().k_table(34)[1:] == [4] * 4 + [2] * 4 + [
        1
    ] * 24 + [0, 0]
    with pytest.raises(PolicyError, match="must include batch_size=1"):
        _parse("trtllm_schedule:lower_bounds:4:4=4,8=2")
    with pytest.raises(PolicyError, match=r"schedule\[1\] must equal max_draft_len"):
        _parse("trtllm_schedule:lower_bounds:4:1=3,8=0")
    with pytest.raises(PolicyError, match="keys"):
        _parse("trtllm_schedule:bounds:4:1=4")


def test_max_concurrency_counts_effective_requests() -> None:
    # max_k 3: 1 + 3 tokens a request. max_num_tokens 8192 -> cap 2048: on up to 32 requests, off from 33.
    assert max_concurrency_table(32, 3, 40, 8192)[31:35] == [3, 3, 0, 0]
    # max_num_tokens 64 -> cap 16: min(100, 512, 16) = 16 <= 32, so speculation stays on at 100 requests.
    assert max_concurrency_table(32, 3, 100, 64)[100] == 3


def test_gate_window_threshold_and_off_for_good() -> None:
    # Window 3, threshold 0.5, k 3. Step 0 verifies nothing (drafted 0): no sample. Samples 0.5 (t1), 1.0 (t2),
    # 0.0 (t3): mean 0.5, not < 0.5, stays on. t4: 0.0 -> last three 1.0, 0, 0, mean 1/3 < 0.5 -> off after t4's
    # observation; t4 itself was decided before it (overlap), so k = 3 for t0..t4 and 0 from t5, for good, even at
    # rate 1.0 (t6, t7).
    drafted = np.array([0, 6, 6, 6, 6, 6, 6, 6])
    accepted = np.array([0, 3, 6, 0, 0, 6, 6, 6])
    ks, shut = replay_gate(
        GateRule(window=3, threshold=0.5), [0] + [3] * 8, np.ones(8, dtype=np.int64), drafted, accepted
    )
    assert ks.tolist() == [3] * 5 + [0] * 3
    assert shut.tolist() == [False] * 4 + [True] * 4


def test_the_engine_executes_what_the_gate_replays(eagle_profile: Profile) -> None:
    policy = _parse("trtllm_acceptance_gate:3:20:0.45")  # chat accepts ~0.55 then 0.45 per position: it shuts
    requests = make_requests(builtin_workload("chat"), poisson_arrivals(20, 20, seed=3), seed=4)
    core = EngineCore(eagle_profile, policy.resolve(), seed=3)
    run_open_loop(core, requests)
    steps = core.steps.as_dict()
    table = policy.resolve().k_table(eagle_profile.limits.max_num_seqs)
    rule = policy.resolve().rule
    assert isinstance(rule, GateRule)
    ks, shut = replay_gate(rule, table, steps["batch_size"], steps["drafted"], steps["accepted"])
    assert np.array_equal(ks, steps["k"]) and shut[-1] and steps["k"][0] == 3 and steps["k"][-1] == 0


def _floor0_run(profile: Profile, fault: bool) -> dict[str, np.ndarray]:
    # upper bounds {2: 3}: batch 1-2 -> 3, 3+ -> 0. Three requests decode together at k = 0 until the short one
    # ends; the other two then speculate at batch 2.
    suffix = ":floor0_fault" if fault else ""
    core = EngineCore(profile, _parse(f"trtllm_schedule:upper_bounds:3:2=3{suffix}").resolve(), seed=7)
    for i, tokens in enumerate((20, 300, 300)):
        core.add_request(SimRequest(request_id=f"r{i}", category="chat", prompt_tokens=64, max_tokens=tokens,
                                    arrival=0.0))  # fmt: skip
    now = 0.0
    while core.has_work():
        now = core.run_steps(now).end
    return core.steps.as_dict()


def test_floor0_fault_collapses_acceptance_after_a_zero_phase(eagle_profile: Profile) -> None:
    healthy, faulty = _floor0_run(eagle_profile, False), _floor0_run(eagle_profile, True)
    assert 0 in healthy["k"].tolist() and 3 in healthy["k"].tolist()
    assert healthy["accepted"].sum() > 0 and faulty["drafted"].sum() > 0
    assert faulty["accepted"].sum() == 0  # both survivors decoded through k = 0: they accept nothing after


def test_trtllm_zero_runs_no_drafter(eagle_profile: Profile) -> None:
    # k = 0 in TensorRT-LLM skips the drafter: an all-zero schedule runs the same timeline as no speculation.
    ends = []
    for text in ("trtllm_schedule:upper_bounds:3:1=0", "off"):
        requests = make_requests(builtin_workload("chat"), poisson_arrivals(10, 5, seed=1), seed=2)
        core = EngineCore(eagle_profile, _parse(text).resolve(), seed=1)
        run_open_loop(core, requests)
        ends.append(core.steps.column("end")[-1])
    assert ends[0] == ends[1]
