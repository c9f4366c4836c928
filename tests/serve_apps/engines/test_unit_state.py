"""A real-time replica serves its warm-up and every unit one after another; a virtual-time unit gets a new engine.
A design whose k depends on the steps before (TensorRT-LLM's gate, SGLang's adaptive steps) must start each unit
from the same fresh state in both, or the verifier, which replays each unit's rule from a fresh state, would see
a gate shut from the first step (or SGLang's EMA mid-way) and fail an engine that did nothing wrong."""

from __future__ import annotations

import asyncio

import numpy as np

from loadshapes.arrivals import poisson_arrivals
from loadshapes.mixes import builtin_workload
from orchestrator.virtual.experiments import make_requests
from serve_apps.engines.base import GenerationInput, begin_unit
from serve_apps.engines.simulated import SimulatedEngine
from serve_apps.policies import parse_policy
from serve_apps.resolved import GateRule, SglangRule
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.rules.sglang_adaptive import replay
from serve_apps.sim.rules.trtllm_gate import replay_gate
from serve_apps.sim.virtual import run_open_loop

GATE = "trtllm_acceptance_gate:3:20:0.45"  # chat accepts less than 0.45 per position here: the gate shuts
SGLANG = "sglang_adaptive:7"  # from 7 steps: its EMA moves the slots down as the load runs


def _replays(policy_text: str, steps: dict[str, np.ndarray], max_num_seqs: int) -> np.ndarray:
    """The k the rule gives at each of the unit's steps, replayed from a fresh state (the verifier's replay)."""
    resolved = parse_policy(policy_text, default_method="eagle", default_model="d").resolve()
    rule = resolved.rule
    if isinstance(rule, GateRule):
        table = resolved.k_table(max_num_seqs)
        return replay_gate(rule, table, steps["batch_size"], steps["drafted"], steps["accepted"])[0]
    assert isinstance(rule, SglangRule)
    decoding = steps["batch_size"] - steps["num_prefill"]
    return replay(rule, max_num_seqs, steps["batch_size"], decoding, steps["accepted"])[0]


def _two_units(profile: Profile, policy_text: str, *, fresh: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One engine runs a unit, then (after begin_unit where `fresh`) the same requests again: the second unit's
    steps and what the rule, replayed from a fresh state on them, gives."""
    core = EngineCore(profile, parse_policy(policy_text, default_method="eagle", default_model="d").resolve(), seed=3)
    requests = make_requests(builtin_workload("chat"), poisson_arrivals(20, 20, seed=3), seed=4)
    end = run_open_loop(core, requests).end
    first = len(core.steps.as_dict()["k"])
    if fresh:
        core.begin_unit()
    again = make_requests(builtin_workload("chat"), poisson_arrivals(20, 20, seed=3), seed=4)
    for request in again:  # the same load after the first unit, on the same engine
        request.request_id, request.arrival = f"second-{request.request_id}", request.arrival + end + 1.0
    run_open_loop(core, again)
    steps = {name: values[first:] for name, values in core.steps.as_dict().items()}
    return steps, _replays(policy_text, steps, profile.limits.max_num_seqs)


def test_each_unit_starts_the_gate_and_sglangs_state_afresh(eagle_profile: Profile) -> None:
    for policy_text in (GATE, SGLANG):
        steps, expected = _two_units(eagle_profile, policy_text, fresh=True)
        assert np.array_equal(steps["k"], expected), policy_text
        # Carried over instead, the second unit disagrees with its replay: the gate is shut from the first step
        stale, expected_stale = _two_units(eagle_profile, policy_text, fresh=False)
        assert not np.array_equal(stale["k"], expected_stale), policy_text
    gate, _ = _two_units(eagle_profile, GATE, fresh=True)
    assert gate["k"][0] == 3 and gate["k"][-1] == 0  # opens again, shuts again


def test_a_real_time_engine_starts_a_unit_afresh_when_the_runner_asks(eagle_profile: Profile) -> None:
    """The real-time engine behind a replica (begin_unit is what /specdrill/timeline?begin_unit=true calls)."""
    policy = parse_policy(GATE, default_method="eagle", default_model="d").resolve()
    engine = SimulatedEngine(eagle_profile, policy, seed=1, time_scale=1.0, engine_id="gate/replica")

    async def unit(tag: str) -> None:
        async def one(i: int) -> None:
            request = GenerationInput(request_id=f"{tag}{i}", prompt_text="a b c d", prompt_token_ids=None,
                                      max_tokens=60, ignore_eos=True, category="chat")  # fmt: skip
            async for _ in engine.generate(request):
                pass

        await asyncio.gather(*(one(i) for i in range(4)))

    async def scenario() -> tuple[list[int], list[int]]:
        await engine.start()
        try:
            await unit("a")
            first = engine.timeline()["k"]
            begin_unit(engine)
            await unit("b")
            return first, engine.timeline(len(first))["k"]
        finally:
            await engine.stop()

    first, second = asyncio.run(scenario())
    assert first[0] == 3 and first[-1] == 0, first  # the gate shut in the first unit
    assert second[0] == 3, second  # and is open again at the second's first step
