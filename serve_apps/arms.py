"""An arm: one speculation policy on one topology, served by one kind of engine."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_apps.policies import DynamicPolicy, FixedPolicy, OffPolicy, Topology

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimulatedEngineConfig(_Strict):
    kind: Literal["simulated"] = "simulated"
    profile: str = "llama3.1-8b-h100-eagle"
    time_scale: float = Field(default=1.0, gt=0)
    seed: int = 0
    max_model_len: int = Field(default=8192, ge=16)


# AsyncEngineArgs fields (vLLM 0.32, vllm/engine/arg_utils.py) that engine_kwargs may not set. The arm's policy
# and topology decide these:
ARM_OWNED_ENGINE_ARGS = frozenset({"model", "speculative_config", "data_parallel_size", "tensor_parallel_size"})
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


class VllmEngineConfig(_Strict):
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
                "cluster's nodes the variable instead (a Kubernetes Secret: docs/models-on-a-cluster.md)"
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


class EndpointEngineConfig(_Strict):
    """Servers someone else runs (any OpenAI-compatible server, e.g. `vllm serve`): nothing is deployed. Each arm
    name maps to its server's base URL; what the server runs is read from its responses' telemetry when it sends
    one (a specdrill arm) and from its /metrics otherwise. The API key comes from the environment variable named
    by `api_key_env` and never enters a file, a trace or a log."""

    kind: Literal["endpoint"] = "endpoint"
    model: str
    urls: dict[str, str] = Field(min_length=1)  # arm name (policy-topology) -> base URL (before /v1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    max_num_seqs: int = Field(default=512, ge=1)
    # The served model's tokenizer (a local path, or a Hugging Face id already in the local cache of every node
    # a load worker runs on; never downloaded): prompt lengths are counted in its tokens. None: in words, said at
    # run start (docs/traffic.md).
    tokenizer: str | None = None

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, v: dict[str, str]) -> dict[str, str]:
        for name, url in v.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"urls.{name}: {url!r} is not an http(s) URL")
        return {name: url.rstrip("/") for name, url in v.items()}


EngineConfig = Annotated[SimulatedEngineConfig | VllmEngineConfig | EndpointEngineConfig, Field(discriminator="kind")]


def prompt_tokenizer_name(engine: SimulatedEngineConfig | VllmEngineConfig | EndpointEngineConfig) -> str | None:
    """Whose tokens a prompt length counts: a vLLM engine's own tokenizer (its `tokenizer` engine arg, else the
    model's), an endpoint's named one; None (words) for the simulated engine, which counts words as tokens."""
    if isinstance(engine, VllmEngineConfig):
        named = engine.engine_kwargs.get("tokenizer")
        return named if isinstance(named, str) and named else engine.model
    if isinstance(engine, EndpointEngineConfig):
        return engine.tokenizer
    return None


def prompt_length_notice(engine: SimulatedEngineConfig | VllmEngineConfig | EndpointEngineConfig) -> str | None:
    """The line a run starts with when a real server will count tokens and the prompts are sized in words."""
    if isinstance(engine, EndpointEngineConfig) and engine.tokenizer is None:
        return (
            f"prompt lengths are words: no tokenizer known for endpoint model {engine.model}; set engine.tokenizer "
            "(a local path or a cached Hugging Face id) to size prompts in its tokens"
        )
    return None


class Resources(_Strict):
    """What each engine of the arm reserves in the Ray cluster (serve_apps/placement.py lays it out)."""

    cpus_per_engine: float = Field(default=0.5, gt=0)
    # GPUs per GPU worker: an engine of tensor_parallel_size T (x data_parallel N for vLLM) has T (x N) workers.
    gpus_per_engine: float = Field(default=0.0, ge=0)
    # GPUs on each GPU node. Decides whether an engine fits one node (the replica holds its GPUs) or spans nodes
    # (a placement group); read from the cluster at deploy time when not given.
    gpus_per_node: int | None = Field(default=None, ge=1)
    # The cluster adds nodes on demand (Ray autoscaler): do not refuse what the nodes up now cannot hold.
    autoscaling: bool = False
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    # At most this many of the arm's engines on one node (Serve's max_replicas_per_node): 1 spreads them out.
    max_engines_per_node: int | None = Field(default=None, ge=1)


class ArmSpec(_Strict):
    name: str
    campaign: str = "default"
    policy: Annotated[OffPolicy | FixedPolicy | DynamicPolicy, Field(discriminator="kind")]
    topology: Topology = Topology()
    engine: EngineConfig
    resources: Resources = Resources()

    @field_validator("name")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"arm name {v!r} must be lowercase letters, digits and '-' (it becomes a URL path)")
        return v

    @model_validator(mode="after")
    def _placement_is_runnable(self) -> ArmSpec:
        from serve_apps.placement import plan_placement  # placement reads arms: imported here, not at the top

        plan_placement(self)  # raises PlacementError (a ValueError) naming the limitation
        return self

    @property
    def app_name(self) -> str:
        return f"{self.campaign}.{self.name}"

    @property
    def route_prefix(self) -> str:
        return f"/{self.campaign}/{self.name}"

    @property
    def served_model_name(self) -> str:
        if isinstance(self.engine, VllmEngineConfig):
            return self.engine.served_model_name or self.engine.model
        if isinstance(self.engine, EndpointEngineConfig):
            return self.engine.model
        return f"sim-{self.engine.profile}"
