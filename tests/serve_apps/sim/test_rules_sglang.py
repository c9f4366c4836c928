"""SGLang 0.5.23's adaptive steps replayed on recorded step sequences, against expectations worked by hand from
its code (sglang/srt/speculative/adaptive_spec_params.py; line numbers in serve_apps/sim/rules/sglang_adaptive.py).

Replay convention (the overlap scheduler, SGLang's default): at step t the rule decides the k of the step, then
the step's verification feeds the slot that decided step t-1. So the n-th observation of a slot that decides
every step happens at step t = n, and a change made by it shows from step t + 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from loadshapes.arrivals import poisson_arrivals
from loadshapes.mixes import builtin_workload
from orchestrator.virtual.experiments import make_requests
from serve_apps.policies import parse_policy, policy_from_dict
from serve_apps.policies_sglang import SglangAdaptivePolicy
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.rules.sglang_adaptive import decode_cuda_graph_bs, graph_sizes, replay, slot_for_batch
from serve_apps.sim.virtual import run_open_loop


def _policy(num_steps: int = 3, **extra: object) -> SglangAdaptivePolicy:
    return SglangAdaptivePolicy(method="eagle", model="d", num_steps=num_steps, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("batch", "slot_key"),
    # Speculative capture sizes (cuda_graph_hook.py): 1..8, 10..32 by 2, 40..64 by 4, 72..256 by 8. bisect_left pads
    # up: 7 -> 7 (key 1), 9 -> 10 (key 8), 29 -> 30 (key 8), 31 -> 32 (key 32: padding crosses the key), 57 -> 60
    # (key 32), 61 -> 64 (key 64), 65 -> 72 (key 64).
    [(1, 1), (7, 1), (8, 8), (9, 8), (29, 8), (31, 32), (32, 32), (57, 32), (61, 64), (63, 64), (65, 64)],
)
def test_padding_to_the_next_cuda_graph_size_then_the_largest_key_below(batch: int, slot_key: int) -> None:
    rule = _policy().rule
    assert rule.tiers[slot_for_batch(rule, batch, graph_sizes(rule, 256))].lower_bound == slot_key


def test_without_cuda_graphs_no_padding_and_a_capped_max_bs_is_appended() -> None:
    rule = _policy(cuda_graph=False).rule
    # No graphs: 31 stays 31 (key 8), 61 stays 61 (key 32).
    assert [rule.tiers[slot_for_batch(rule, b, None)].lower_bound for b in (31, 61)] == [8, 32]
    # max_num_seqs 61 caps the default max_bs (memory_hook.py): sizes ..., 56, 60, then 61 appended, so 61 -> 61.
    rule = _policy().rule
    assert decode_cuda_graph_bs(61)[-3:] == (56, 60, 61)
    assert rule.tiers[slot_for_batch(rule, 61, graph_sizes(rule, 61))].lower_bound == 32


def test_warmup_interval_ema_and_down_hysteresis_in_the_first_slot() -> None:
    # Slot "1" = [1, 3, 5, 7], up_h 0, down_h -0.25; num_steps 3 is a candidate, so it starts at 3, EMA 3 - 1 = 2.
    # Batch 1 every step, one request verifying. Accepted 3 for observations 1..20, then 0.
    # EMA_n = 3 - 0.8^n while accepting 3. Observations 1..10: warm-up. 15: EMA = 3 - 0.8^15 = 2.9648 > 3 - 0.5
    #   -> 5 (and not > 4.5: stays 5); k = 5 from step 16. 20: EMA = 2.98847, not <= 3 - 0.5 - 0.25 = 2.25, not
    #   > 4.5: stays 5.
    # Then EMA_n = 2.98847 * 0.8^(n - 20). 25: 0.97926 <= 2.25 -> 3, but > 1 - 0.5 - 0.25 = 0.25: stops at 3; k = 3
    #   from step 26. 30: 0.32088 > 0.25: stays 3 (without the -0.25 hysteresis, <= 0.5 would have dropped it).
    #   35: 0.10515 <= 0.25 -> 1; k = 1 from step 36.
    n = 40
    accepted = np.array([0] + [3] * 20 + [0] * (n - 21))
    ks, slots, emas = replay(_policy(3).rule, 256, np.ones(n, dtype=np.int64), np.ones(n, dtype=np.int64), accepted)
    assert ks.tolist() == [3] * 16 + [5] * 10 + [3] * 10 + [1] * 4
    assert set(slots.tolist()) == {0}
    assert np.isnan(emas[0])
    assert emas[15] == pytest.approx(3 - 0.8**15) and emas[30] == pytest.approx((3 - 0.8**20) * 0.8**10)


def test_zero_steps_freeze_the_ema_and_probe_the_next_candidate() -> None:
    # Slot "8" = [0, 1, 3], hysteresis 0; num_steps 1 is a candidate: starts at 1, EMA 0. Batch 8, accepted 0.
    # 15: EMA 0 <= 0.5 (prev candidate 0) -> 0; k = 0 from step 16. At 0 the EMA does not move (196-202) but the
    # batches still count. 20: from 0 probe the next candidate -> 1 (EMA 0 is not < 0: kept); k = 1 from 21.
    # 25: EMA 0 -> 0 again; 30: probe -> 1. So 1 x16, 0 x5, 1 x5, 0 x5, 1 x5.
    n = 36
    batch = np.full(n, 8, dtype=np.int64)
    ks, slots, _ = replay(_policy(1).rule, 256, batch, batch, np.zeros(n, dtype=np.int64))
    assert ks.tolist() == [1] * 16 + [0] * 5 + [1] * 5 + [0] * 5 + [1] * 5
    assert set(slots.tolist()) == {1}


def test_each_slot_keeps_its_own_ema_and_count() -> None:
    # Alternate batch 1 (slot "1") and batch 64 (slot "64" = [0]): each slot counts only what it decided. Slot "1"
    # decides steps 0, 2, 4, ...; its observations come at steps 1, 3, 5, ... (the step after), so its 15th
    # observation is at step 29 and k = 5 shows at its next decision, step 30. Slot "64" always gives 0.
    n = 32
    batch = np.array([1 if t % 2 == 0 else 64 for t in range(n)], dtype=np.int64)
    accepted = np.array([3 if t % 2 == 1 else 0 for t in range(n)])
    n_verified = np.ones(n, dtype=np.int64)
    ks, _, _ = replay(_policy(3).rule, 256, batch, n_verified, accepted)
    assert ks[0:30:2].tolist() == [3] * 15 and ks[30] == 5
    assert set(ks[1::2].tolist()) == {0}


def test_shared_settings_and_bad_configs_as_sglang_reads_them() -> None:
    policy = policy_from_dict(
        {"kind": "sglang_adaptive", "method": "eagle3", "model": "d", "num_steps": 2,
         "adaptive_config": {"ema_alpha": 0.5, "warmup_batches": 0, "1": {"candidate_steps": [2, 1]}}}
    )  # fmt: skip
    assert isinstance(policy, SglangAdaptivePolicy)
    rule = policy.rule
    assert (rule.ema_alpha, rule.warmup_batches, rule.tiers[0].candidate_steps) == (0.5, 0, (1, 2))
    for bad, message in [
        ({"1": {"candidate_steps": []}}, "candidate_steps must be a list"),
        ({"x": 1}, "expected a batch size"),
        ({"ema_alpha": 0.2}, "at least one integer-string"),
    ]:
        with pytest.raises(Exception, match=message):
            _policy(adaptive_config=bad)
    assert parse_policy("sglang_adaptive:3", default_method="eagle", default_model="d") == _policy(3)


def test_the_engine_executes_what_the_rule_replays(eagle_profile: Profile) -> None:
    # The simulated engine's own step timeline, replayed: the k it executed is the rule's, step by step, and the
    # ramp past 8 and 32 requests reaches slots whose steps go to 0.
    requests = make_requests(builtin_workload("chat"), poisson_arrivals(40, 30, seed=5), seed=6)
    policy = _policy(3)
    core = EngineCore(eagle_profile, policy.resolve(), seed=5)
    run_open_loop(core, requests)
    steps = core.steps.as_dict()
    batch, decoding = steps["batch_size"], steps["batch_size"] - steps["num_prefill"]
    ks, slots, _ = replay(policy.rule, eagle_profile.limits.max_num_seqs, batch, decoding, steps["accepted"])
    assert np.array_equal(ks, steps["k"])
    assert len(set(slots.tolist())) >= 2 and set(steps["k"].tolist()) >= {0, 3}


def test_zero_steps_pay_the_idle_drafter_as_vllms_zero(eagle_profile: Profile) -> None:
    # Every slot at [0]: SGLang still verifies 1 token and updates the drafter's KV (eagle_worker_v2.py), the same
    # work as vLLM's k = 0 step: the same timeline as an all-zero vLLM schedule, slower than no speculation.
    zero = _policy(0, adaptive_config={"1": {"candidate_steps": [0]}})
    vllm_zero = parse_policy("dynamic:1:1-512=0", default_method="eagle", default_model="d")
    off = parse_policy("off", default_method="eagle", default_model="d")
    ends = []
    for policy in (zero, vllm_zero, off):
        requests = make_requests(builtin_workload("chat"), poisson_arrivals(10, 5, seed=1), seed=2)
        core = EngineCore(eagle_profile, policy.resolve(), seed=1)
        run_open_loop(core, requests)
        ends.append(core.steps.column("end")[-1])
    assert ends[0] == ends[1] > ends[2]
