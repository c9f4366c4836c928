"""The speculation knobs beside k (serve_apps/spec_knobs.py): vLLM's rules per version, the arms they make, what
a vLLM arm passes to vLLM, what a simulated arm runs, and how the map labels them."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.plan.campaign import Campaign
from serve_apps.policies import DynamicPolicy, FixedPolicy, PolicyError, Topology, policy_from_dict
from serve_apps.spec_knobs import conditional_rates, knob_refusal, knobs_text, rates_from_length, synthetic_rates
from serve_apps.vllm_expect import validation_lines
from serve_apps.vllm_versions import VllmTarget

EAGLE = {"kind": "fixed", "method": "eagle", "model": "drafter", "k": 3}


def _policy(**knobs: Any) -> Any:
    return policy_from_dict({**EAGLE, **knobs})


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(PolicyError) as caught:
        policy_from_dict(data)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- vLLM's rules, the same text in 0.32, 0.33 and 0.34 (config/speculative.py 0.32:566-598, 0.33:600-632,
# 0.34:648-680) ---


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"rejection_sample_method": "synthetic"}, "exactly one of"),
        (
            {
                "rejection_sample_method": "synthetic",
                "synthetic_acceptance_rates": [0.5, 0.4, 0.1],
                "synthetic_acceptance_length": 2,
            },
            "exactly one of",
        ),
        ({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.4]}, "2 entries, must be 3"),
        ({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [1.2, 0.4, 0.1]}, "not in [0, 1]"),
        ({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.6, 0.1]}, "non-increasing"),
        ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 4.5}, "not in [1, 4]"),
        ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 0.5}, "not in [1, 4]"),
        ({"synthetic_acceptance_rates": [0.5, 0.4, 0.1]}, "apply only with rejection_sample_method 'synthetic'"),
        ({"rejection_sample_method": "fly", "synthetic_acceptance_length": 2}, "apply only with"),
        ({"rejection_sample_method": "greedy"}, "rejection_sample_method"),
        ({"draft_lm_head_quantization": "int8"}, "draft_lm_head_quantization"),
    ],
)
def test_each_rule_refused_in_one_line_naming_the_field(knobs: dict[str, Any], field: str) -> None:
    assert field in _error({**EAGLE, **knobs})


def test_fly_needs_k_2_and_lm_head_quantization_a_shared_head() -> None:
    assert "needs k >= 2" in _error({**EAGLE, "k": 1, "rejection_sample_method": "fly"})
    assert _policy(rejection_sample_method="fly").k == 3
    assert "shares no target lm_head" in _error(
        {"kind": "fixed", "method": "ngram", "k": 3, "draft_lm_head_quantization": "fp8"}
    )
    assert _policy(draft_lm_head_quantization="nvfp4").draft_lm_head_quantization == "nvfp4"
    mtp = policy_from_dict({"kind": "fixed", "method": "deepseek_mtp", "k": 1, "draft_lm_head_quantization": "fp8",
                            "model": "m"})  # fmt: skip
    assert mtp.draft_lm_head_quantization == "fp8"


def test_dynamic_policies_measure_the_rates_against_max_k() -> None:
    data = {"kind": "dynamic", "method": "ngram", "max_k": 3, "schedule": [[1, 4, 3], [5, 64, 1]],
            "rejection_sample_method": "synthetic"}  # fmt: skip
    ok = policy_from_dict({**data, "synthetic_acceptance_rates": [1, 0.5, 0.25]})
    assert isinstance(ok, DynamicPolicy) and ok.synthetic_acceptance_rates == (1.0, 0.5, 0.25)
    assert "must be 3" in _error({**data, "synthetic_acceptance_rates": [0.5]})


def test_length_resolves_as_vllm_does() -> None:
    # vLLM's minimum-variance schedule (config/speculative.py 0.32:556-563)
    assert rates_from_length(2.5, 3) == [1.0, 0.5, 0.0]
    assert rates_from_length(1.0, 3) == [0.0, 0.0, 0.0]
    assert rates_from_length(4.0, 3) == [1.0, 1.0, 1.0]
    assert synthetic_rates(None, 2.5, 3) == [1.0, 0.5, 0.0]
    assert conditional_rates([0.9, 0.6, 0.3]) == pytest.approx([0.9, 2 / 3, 0.5])
    assert conditional_rates([1.0, 0.0, 0.0]) == [1.0, 0.0, 0.0]


def test_config_carries_the_knobs_only_where_they_are_not_the_defaults() -> None:
    assert FixedPolicy(method="eagle", model="d", k=3).to_vllm_speculative_config() == {
        "method": "eagle", "num_speculative_tokens": 3, "model": "d",
    }  # fmt: skip
    config = _policy(rejection_sample_method="synthetic", synthetic_acceptance_length=2).to_vllm_speculative_config()
    assert config["rejection_sample_method"] == "synthetic" and config["synthetic_acceptance_length"] == 2.0
    assert "synthetic_acceptance_rates" not in config
    quant = _policy(draft_lm_head_quantization="fp8").to_vllm_speculative_config()
    assert quant["draft_lm_head_quantization"] == "fp8" and "rejection_sample_method" not in quant


# --- per version (serve_apps/vllm_versions.py) ---

V32, V33, V34 = VllmTarget("0.32.0", {}), VllmTarget("0.33.0", {}), VllmTarget("0.34.0", {})


def test_fly_is_refused_by_0_32_only() -> None:
    fly = _policy(rejection_sample_method="fly")
    refused = knob_refusal(V32, fly)
    assert refused is not None and "vLLM 0.32.0" in refused and "'fly'" in refused and "\n" not in refused
    assert knob_refusal(V33, fly) is None and knob_refusal(V34, fly) is None
    assert knob_refusal(VllmTarget("0.35.1", {}), fly) is None  # an untested newer minor is judged as 0.34


def test_lm_head_quantization_needs_0_33_and_model_runner_v2() -> None:
    quant = _policy(draft_lm_head_quantization="fp8")
    assert "vLLM 0.32.0 has no such field" in str(knob_refusal(V32, quant))
    assert knob_refusal(V33, quant) is None  # V2 by default on a GPU build
    on_v1 = knob_refusal(VllmTarget("0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"}), quant)
    assert on_v1 is not None and "model runner V1" in on_v1 and "0.33.0" in on_v1
    assert knob_refusal(V34, quant) is None


def test_synthetic_runs_on_every_gpu_minor_but_not_on_vllm_cpu() -> None:
    synthetic = _policy(rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.7, 0.5, 0.3])
    assert all(knob_refusal(t, synthetic) is None for t in (V32, V33, V34))
    block = _policy(rejection_sample_method="block")
    assert all(knob_refusal(t, block) is None for t in (V32, V33, V34))
    on_cpu = knob_refusal(VllmTarget("0.32.0", {}, cpu=True), synthetic)
    assert on_cpu is not None and "cpu_triton_utils.py 0.32:330, 369" in on_cpu


def _vllm_campaign(policies: dict[str, Any], topologies: dict[str, Any] | None = None) -> Campaign:
    return Campaign.model_validate({
        "name": "knobs", "engine": {"kind": "vllm", "model": "m"},
        "policies": {"off": "off", **policies}, "topologies": topologies or {"single": "single"},
    })  # fmt: skip


def test_validation_names_the_version_that_refuses_a_knob() -> None:
    campaign = _vllm_campaign({"fly": {**EAGLE, "rejection_sample_method": "fly"}})
    lines = validation_lines(campaign.arms(), {}, V32)
    assert lines == [
        "arm fly-single: vLLM 0.32.0 (installed here) refuses it: rejection_sample_method 'fly' is not in vLLM "
        "0.32.0's RejectionSampleMethod (has block, standard, synthetic; fly since 0.33)"
    ]
    assert validation_lines(campaign.arms(), {}, V33) == []


# --- arms, labels, the map ---


def test_policies_that_differ_only_in_a_knob_are_two_arms_named_apart() -> None:
    campaign = _vllm_campaign({
        "std": EAGLE,
        "syn": {**EAGLE, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.7, 0.5, 0.3]},
        "quant": {**EAGLE, "draft_lm_head_quantization": "fp8"},
    })  # fmt: skip
    labels = {a.name: a.policy.label for a in campaign.arms()}
    assert labels == {
        "off-single": "off", "std-single": "fixed-eagle-k3", "syn-single": "fixed-eagle-k3-synthetic[0.7,0.5,0.3]",
        "quant-single": "fixed-eagle-k3-lmhead-fp8",
    }  # fmt: skip
    arm = next(a for a in campaign.arms() if a.name == "syn-single")
    assert knobs_text(arm.policy, arm.topology) == "synthetic[0.7,0.5,0.3]"


def test_prefill_schedule_interval_is_a_data_parallel_topologys() -> None:
    dp = Topology(kind="data_parallel", size=2, prefill_schedule_interval=4)
    assert dp.label == "data_parallel2-prefill-every4"
    with pytest.raises(ValueError, match="only in a data-parallel engine"):
        Topology(kind="replicas", size=2, prefill_schedule_interval=4)
    campaign = _vllm_campaign(
        {"std": EAGLE},
        {"dp": {"kind": "data_parallel", "size": 2}, "dp4": {"kind": "data_parallel", "size": 2,
                                                              "prefill_schedule_interval": 4}},
    )  # fmt: skip
    names = sorted(a.name for a in campaign.arms())
    assert names == ["off-dp", "off-dp4", "std-dp", "std-dp4"]
    arm = next(a for a in campaign.arms() if a.name == "std-dp4")
    assert knobs_text(arm.policy, arm.topology) == "prefill-every4"
    with pytest.raises(ValueError, match="engine_kwargs may not set prefill_schedule_interval"):
        Campaign.model_validate({
            "name": "x", "engine": {"kind": "vllm", "model": "m", "engine_kwargs": {"prefill_schedule_interval": 2}},
            "policies": {"off": "off"},
        })  # fmt: skip


def _sim(policies: dict[str, Any], topologies: dict[str, Any] | None = None) -> Campaign:
    return Campaign.model_validate({
        "name": "simknobs", "engine": {"kind": "simulated"}, "policies": {"off": "off", **policies},
        "topologies": topologies or {"single": "single"},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "topology", "said"),
    [
        ({**EAGLE, "rejection_sample_method": "fly"}, "single", "cannot model its acceptance"),
        ({**EAGLE, "rejection_sample_method": "block"}, "single", "cannot model its acceptance"),
        ({**EAGLE, "draft_lm_head_quantization": "fp8"}, "single", "quantized drafter head"),
        (EAGLE, {"kind": "data_parallel", "size": 2, "prefill_schedule_interval": 2}, "no data-parallel engine core"),
    ],
)
def test_simulated_arms_refuse_what_the_simulator_cannot_model(policy: Any, topology: Any, said: str) -> None:
    with pytest.raises(ValueError, match=said) as caught:
        _sim({"p": policy}, {"t": topology})
    assert "on topologies.t: " in str(caught.value)  # the first arm it cannot run, named


def test_the_map_labels_an_arm_with_its_knobs() -> None:
    from orchestrator.analysis.opmap.results import OperatingMap

    fields = {"measure": "offered_rate", "unit": "req/s", "bands": [], "baseline": "off", "arms": ["off", "syn"],
              "cells": [], "crossovers": [], "unbanded": {}, "settings": {}}  # fmt: skip
    plain = OperatingMap.model_validate(fields)
    assert "knobs" not in plain.model_dump()  # a run without knobs writes what it wrote before
    knobbed = OperatingMap.model_validate({**fields, "knobs": {"syn": "synthetic[0.7,0.5,0.3]"}})
    assert knobbed.arm_label("syn") == "syn synthetic[0.7,0.5,0.3]" and knobbed.arm_label("off") == "off"
    from orchestrator.report.html.maps import map_section

    assert '<div class="muted">synthetic[0.7,0.5,0.3]</div>' in map_section(knobbed, 0)
