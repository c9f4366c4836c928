"""vLLM's AsyncLLM, run by specdrill inside a Serve replica."""

from __future__ import annotations

from collections.abc import Sequence

from serve_apps.engine_kinds.base import EngineConfigBase, EngineKind, ServedArm
from serve_apps.engine_kinds.registry import register
from serve_apps.engine_kinds.vllm_config import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, VllmEngineConfig, as_vllm
from serve_apps.engines.base import Engine


class VllmKind(EngineKind):
    name = "vllm"
    config = VllmEngineConfig
    deploy_timeout_s = 900.0  # loading weights, compiling and capturing graphs
    spawns_workers = True

    def served_model_name(self, config: EngineConfigBase) -> str:
        vllm = as_vllm(config)
        return vllm.served_model_name or vllm.model

    def prompt_tokenizer(self, config: EngineConfigBase) -> str | None:
        vllm = as_vllm(config)
        named = vllm.engine_kwargs.get("tokenizer")
        return named if isinstance(named, str) and named else vllm.model

    def tokenizer_field(self, config: EngineConfigBase) -> str:
        return "engine.engine_kwargs.tokenizer" if "tokenizer" in as_vllm(config).engine_kwargs else "engine.model"

    def max_num_seqs(self, config: EngineConfigBase) -> int | None:
        return as_vllm(config).max_num_seqs

    def max_model_len(self, config: EngineConfigBase) -> int | None:
        return as_vllm(config).max_model_len

    def loaded_model(self, config: EngineConfigBase) -> str | None:
        return as_vllm(config).model

    def replica_env(self, config: EngineConfigBase) -> dict[str, str]:
        return as_vllm(config).env

    def arm_warnings(self, config: EngineConfigBase, arms: Sequence[ServedArm]) -> list[str]:
        # The vLLM installed here, where there is one (the cluster's replicas check their own before starting).
        from serve_apps.engines.vllm_support import installed_vllm
        from serve_apps.vllm_expect import validation_lines

        env = as_vllm(config).env
        return validation_lines(arms, env, installed_vllm(env))

    def gpu_memory_share(self, config: EngineConfigBase) -> tuple[float, str]:
        kwargs = as_vllm(config).engine_kwargs
        share = kwargs.get("gpu_memory_utilization", VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
        return float(share), "engine_kwargs" if "gpu_memory_utilization" in kwargs else "vLLM's default"

    def build_engine(self, arm: ServedArm, *, engine_id: str, seed_offset: int) -> Engine:
        # Imported here, in the replica that runs it: the engine's module brings vLLM's stat loggers with it.
        from serve_apps.engines.vllm_engine import VllmEngine

        return VllmEngine(arm, engine_id=engine_id)


KIND = register(VllmKind())
