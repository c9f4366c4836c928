"""vLLM's engine config, the campaign's `engine: {kind: vllm}` section: below both the kind (engine_kinds/vllm.py)
and the engine that runs it (engines/vllm_engine.py), so that the kind can import the engine plainly."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from serve_apps.engine_kinds.base import EngineConfigBase

# AsyncEngineArgs fields (vLLM 0.32, vllm/engine/arg_utils.py) that engine_kwargs may not set. The arm's policy
# and topology decide these:
ARM_OWNED_ENGINE_ARGS = frozenset(
    {"model", "speculative_config", "data_parallel_size", "tensor_parallel_size", "prefill_schedule_interval"}
)
# and the layout (serve_apps/placement.py) these: each changes how many devices the engine uses, where its ranks
# and workers run or how they find each other, so set behind placement's back the engine would start with too
# few GPUs, or wait for ranks nobody starts.
PLACEMENT_OWNED_ENGINE_ARGS = frozenset(
    {
        "pipeline_parallel_size", "prefill_context_parallel_size", "decode_context_parallel_size",
        "data_parallel_size_local", "data_parallel_rank", "data_parallel_start_rank", "data_parallel_address",
        "data_parallel_rpc_port", "data_parallel_hybrid_lb", "data_parallel_external_lb",
        "data_parallel_multi_port_external_lb", "data_parallel_backend", "distributed_executor_backend",
        "nnodes", "node_rank", "master_addr", "master_port", "device_ids", "placement_group",
    }
)  # fmt: skip
# vLLM 0.32's CacheConfig.gpu_memory_utilization default: the share of a GPU's memory each engine takes.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92


class VllmEngineConfig(EngineConfigBase):
    """Engine args for vLLM's AsyncLLM; engine_kwargs passes any other AsyncEngineArgs field through."""

    kind: Literal["vllm"] = "vllm"
    model: str
    served_model_name: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=16)
    max_num_seqs: int | None = Field(default=None, ge=1)
    enforce_eager: bool = False
    seed: int = 0
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # Environment of the engine's replica (e.g. VLLM_CPU_KVCACHE_SPACE on CPU machines).
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, v: dict[str, str]) -> dict[str, str]:
        # env is part of the campaign (written to the run's manifest) and becomes a Ray runtime_env, which Ray's
        # runtime-env agent logs on every node: a token here would be written in both.
        secret = next((name for name in sorted(v) if re.search(r"(TOKEN|SECRET|PASSWORD|API_KEY)$", name)), None)
        if secret is not None:
            raise ValueError(
                f"env may not carry {secret}: it would be written to the run's manifest and Ray's logs; give the "
                "cluster's nodes the variable instead (a Kubernetes Secret: docs/operator/models-on-a-cluster.md)"
            )
        return v

    @field_validator("engine_kwargs")
    @classmethod
    def _not_owned_by_arm(cls, v: dict[str, Any]) -> dict[str, Any]:
        clash = sorted((ARM_OWNED_ENGINE_ARGS | PLACEMENT_OWNED_ENGINE_ARGS) & set(v))
        if clash:
            raise ValueError(
                f"engine_kwargs may not set {', '.join(clash)}: the arm's policy, topology and placement do"
            )
        return v


def as_vllm(config: EngineConfigBase) -> VllmEngineConfig:
    if not isinstance(config, VllmEngineConfig):
        raise TypeError(f"engine kind {config.kind} is not vllm")
    return config
