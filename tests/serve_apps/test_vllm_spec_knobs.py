"""The speculation knobs against the real vLLM package (vllm-cpu 0.32 in the test extras): vLLM accepts what we
emit and resolves it as we do, refuses what we refuse for 0.32, and its CPU build cannot sample synthetically."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_apps.policies import FixedPolicy, PolicyError, policy_from_dict
from serve_apps.spec_knobs import knob_refusal, synthetic_rates

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

pytestmark = pytest.mark.vllm


def _vllm(module: str) -> Any:
    return pytest.importorskip(module, reason="vLLM is not installed (the vllm-cpu extra installs it)")


def _config(model: str, speculative: dict[str, Any], **extra: Any) -> Any:
    args = _vllm("vllm.engine.arg_utils").AsyncEngineArgs(
        model=model, dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=8,
        speculative_config=speculative, **extra,
    )  # fmt: skip
    return args.create_engine_config()


@given(
    st.integers(1, 5),
    st.one_of(st.none(), st.lists(st.floats(-0.2, 1.2, allow_nan=False), min_size=0, max_size=6)),
    st.one_of(st.none(), st.floats(0.0, 7.0, allow_nan=False)),
)
@settings(max_examples=400, deadline=None)
def test_synthetic_rules_are_vllms(k: int, rates: list[float] | None, length: float | None) -> None:
    resolve = _vllm("vllm.config.speculative").SpeculativeConfig._resolve_synthetic_acceptance_rates
    try:
        theirs = resolve(k, rates, length)
    except ValueError:
        with pytest.raises(ValueError):
            synthetic_rates(None if rates is None else tuple(rates), length, k)
    else:
        assert synthetic_rates(None if rates is None else tuple(rates), length, k) == theirs


@pytest.mark.parametrize(
    "knobs",
    [
        {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.7, 0.5, 0.3]},
        {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5},
        {"rejection_sample_method": "block"},
    ],
    ids=["rates", "length", "block"],
)
def test_vllm_accepts_our_knobs_and_resolves_them_like_us(
    tiny_model_dir: str, tiny_draft_dir: str, knobs: dict[str, Any]
) -> None:
    policy = policy_from_dict({"kind": "fixed", "method": "draft_model", "model": tiny_draft_dir, "k": 3, **knobs})
    spec = _config(tiny_model_dir, policy.to_vllm_speculative_config()).speculative_config
    assert spec.rejection_sample_method == policy.rejection_sample_method
    if policy.rejection_sample_method == "synthetic":
        ours = synthetic_rates(policy.synthetic_acceptance_rates, policy.synthetic_acceptance_length, 3)
        assert spec.synthetic_acceptance_rates == ours


def test_0_32_refuses_what_we_refuse_for_it(tiny_model_dir: str, tiny_draft_dir: str) -> None:
    from serve_apps.engines.vllm_support import installed_vllm

    target = installed_vllm(dict(os.environ))
    assert target is not None and target.minor == (0, 32) and target.cpu
    draft = {"kind": "fixed", "method": "draft_model", "model": tiny_draft_dir, "k": 3}
    fly = policy_from_dict({**draft, "rejection_sample_method": "fly"})
    assert "'fly' is not in vLLM 0.32.0's RejectionSampleMethod" in str(knob_refusal(target, fly))
    with pytest.raises(Exception, match="rejection_sample_method"):
        _config(tiny_model_dir, fly.to_vllm_speculative_config())
    eagle = FixedPolicy(method="eagle", model=tiny_draft_dir, k=3, draft_lm_head_quantization="fp8")
    assert "no such field" in str(knob_refusal(target, eagle))
    with pytest.raises(Exception, match="draft_lm_head_quantization"):
        _config(tiny_model_dir, eagle.to_vllm_speculative_config())
    with pytest.raises(PolicyError, match="needs k >= 2"):
        policy_from_dict({**draft, "k": 1, "rejection_sample_method": "fly"})


def test_vllm_cpu_cannot_sample_synthetically_and_we_say_so(tiny_model_dir: str, tiny_draft_dir: str) -> None:
    """vllm-cpu 0.32 accepts the config, and its CPU replacement of the Triton rejection kernels then asserts
    synthetic mode away at the first verify step (vllm/utils/cpu_triton_utils.py:330 greedy, :369 random): a
    synthetic arm cannot give the suite's random-weight models realistic acceptance on CPU. We refuse it before
    the engine starts, naming that line."""
    import torch

    from serve_apps.engines.vllm_support import installed_vllm

    kernels = _vllm("vllm.utils.cpu_triton_utils")
    out = torch.full((1, 4), -1, dtype=torch.int64)
    with pytest.raises(AssertionError, match="Synthetic acceptance not supported with CPU sampling"):
        kernels._rejection_greedy_sample_kernel_impl(
            out, torch.tensor([3]), torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]), torch.tensor([[4]]), None, 3,
            torch.rand(3), torch.tensor([0.7, 0.7, 0.6]), SYNTHETIC_MODE=True,
        )  # fmt: skip
    policy = policy_from_dict({"kind": "fixed", "method": "draft_model", "model": tiny_draft_dir, "k": 3,
                               "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0})  # fmt: skip
    target = installed_vllm(dict(os.environ))
    assert target is not None
    assert "cpu_triton_utils.py 0.32:330, 369" in str(knob_refusal(target, policy))


def test_prefill_schedule_interval_reaches_vllms_scheduler_config(tiny_model_dir: str) -> None:
    from orchestrator.plan.campaign import Campaign
    from serve_apps.engines.vllm_engine import VllmEngine

    campaign = Campaign.model_validate({
        "name": "psi", "engine": {"kind": "vllm", "model": tiny_model_dir, "dtype": "float32", "enforce_eager": True,
                                  "max_model_len": 256},
        "policies": {"off": "off"},
        "topologies": {"dp": {"kind": "data_parallel", "size": 2, "prefill_schedule_interval": 4}},
    })  # fmt: skip
    (arm,) = campaign.arms()
    config = VllmEngine(arm, engine_id="e").engine_args().create_engine_config()
    assert config.scheduler_config.prefill_schedule_interval == 4
    assert config.parallel_config.data_parallel_size == 2
