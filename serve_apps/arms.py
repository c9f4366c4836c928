"""An arm: one speculation policy on one topology, served by one kind of engine."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import serve_apps.engine_kinds  # noqa: F401 (registers the built-in kinds before the union is built)
from serve_apps.engine_kinds.base import EngineConfigBase

# TEMPORARY (issue 34): re-exported until the importers other helpers are rewriting now move (this session).
from serve_apps.engine_kinds.endpoint import EndpointEngineConfig as EndpointEngineConfig
from serve_apps.engine_kinds.registry import bind_engine_field, config_union, kind_of
from serve_apps.engine_kinds.simulated import SimulatedEngineConfig as SimulatedEngineConfig
from serve_apps.engine_kinds.vllm import VllmEngineConfig as VllmEngineConfig
from serve_apps.policies import DynamicPolicy, FixedPolicy, OffPolicy, Topology

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


if TYPE_CHECKING:
    EngineConfig = EngineConfigBase
else:
    EngineConfig = config_union()  # every registered kind's config, told apart by `kind`


def prompt_tokenizer_name(engine: EngineConfigBase) -> str | None:
    """Whose tokens a prompt length counts: a vLLM engine's own tokenizer (its `tokenizer` engine arg, else the
    model's), an endpoint's named one; None (words) for the simulated engine, which counts words as tokens."""
    return kind_of(engine).prompt_tokenizer(engine)


def prompt_length_notice(engine: EngineConfigBase) -> str | None:
    """The line a run starts with when a real server will count tokens and the prompts are sized in words."""
    return kind_of(engine).prompt_length_notice(engine)


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
        return kind_of(self.engine).served_model_name(self.engine)


bind_engine_field(ArmSpec)
