"""Each policy kind's facts, asked where the arm model, the engines and the analysis need them: another engine's
design is an arm on the simulated engine (and on that engine's endpoint), refused on a vLLM engine; the analysis's
ArmInfo says of each what k it can reach, which table or rule holds its steps, and which topology fallback it has."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.analysis.read.arms import ArmInfo
from serve_apps.arms import ArmSpec
from serve_apps.policies import AnyPolicy, Topology, parse_policy
from serve_apps.policy_kinds import POLICY_KINDS, engine_config, facts
from serve_apps.resolved import GateRule, SglangRule

SHORT = {
    "sglang_adaptive": "sglang_adaptive:3",
    "trtllm_schedule": "trtllm_schedule:upper_bounds:4:4=4,8=2,32=1",
    "trtllm_max_concurrency": "trtllm_max_concurrency:3:32",
    "trtllm_acceptance_gate": "trtllm_acceptance_gate:3:50:0.3",
}


def _policy(text: str) -> AnyPolicy:
    return parse_policy(text, default_method="eagle", default_model="d")


def _arm(policy: str, engine: dict[str, Any], topology: str = "single") -> ArmSpec:
    topo = {"kind": "single"} if topology == "single" else {"kind": "data_parallel", "size": 2}
    return ArmSpec.model_validate({"name": "a", "policy": _policy(policy), "topology": topo, "engine": engine})


@pytest.mark.parametrize("kind", sorted(SHORT))
def test_another_engines_design_is_an_arm_of_the_simulated_engine_not_of_vllm(kind: str) -> None:
    arm = _arm(SHORT[kind], {"kind": "simulated"})
    assert arm.policy.kind == kind and engine_config(arm.policy) == arm.policy.to_engine_config()  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match=f"is {facts(kind).engine}'s design: vLLM cannot run it"):
        _arm(SHORT[kind], {"kind": "vllm", "model": "m"})


def test_every_kind_has_facts() -> None:
    assert set(POLICY_KINDS) == {"off", "fixed", "dynamic", *SHORT}
    assert {k for k, f in POLICY_KINDS.items() if f.check != "table"} == {"sglang_adaptive", "trtllm_acceptance_gate"}
    assert {k for k, f in POLICY_KINDS.items() if f.floor0} == {"trtllm_schedule", "trtllm_max_concurrency"}


def test_arm_info_describes_each_design() -> None:
    sglang = ArmInfo.from_policy("s", _policy(SHORT["sglang_adaptive"]), max_num_seqs=128)
    assert (sglang.k, sglang.fallback_k, sglang.schedule) == (7, 3, None) and isinstance(sglang.rule, SglangRule)
    # before any verification moves them: slot 1 and 8 start at 3 steps, 32 at its middle candidate 1, 64 at 0;
    # batch 31 and 61 are padded up into the next slot (CUDA-graph sizes 32 and 64)
    table = sglang.k_table()
    assert [int(table[b]) for b in (1, 7, 8, 30, 31, 60, 61, 128)] == [3, 3, 3, 3, 1, 1, 0, 0]
    upper = ArmInfo.from_policy("u", _policy(SHORT["trtllm_schedule"]), max_num_seqs=64)
    assert upper.schedule == ((1, 4, 4), (5, 8, 2), (9, 32, 1), (33, 64, 0)) and upper.rule is None
    cap = ArmInfo.from_policy("c", _policy(SHORT["trtllm_max_concurrency"]), max_num_seqs=64)
    assert cap.schedule == ((1, 32, 3), (33, 64, 0))
    gate = ArmInfo.from_policy("g", _policy(SHORT["trtllm_acceptance_gate"]), max_num_seqs=64)
    assert isinstance(gate.rule, GateRule) and gate.k == 3 and set(gate.k_table()[1:].tolist()) == {3}
    assert not (upper.expects_static_fallback or gate.expects_static_fallback)


def test_sglang_under_attention_dp_falls_back_as_vllms_schedule_does() -> None:
    dp2 = Topology(kind="data_parallel", size=2)
    sglang = ArmInfo.from_policy("s", _policy(SHORT["sglang_adaptive"]), topology=dp2, max_num_seqs=64)
    dynamic = ArmInfo.from_policy("d", _policy("dynamic:3:1-8=3,9-64=1"), topology=dp2, max_num_seqs=64)
    assert sglang.expects_static_fallback and dynamic.expects_static_fallback
    assert sglang.drop_cause == "SGLang's attention-DP fallback (topology data_parallel2)"
    assert dynamic.drop_cause == "vLLM's data-parallel fallback (topology data_parallel2)"
    assert _arm(SHORT["sglang_adaptive"], {"kind": "simulated"}, "dp2").policy.resolve(dp2).schedule_dropped
