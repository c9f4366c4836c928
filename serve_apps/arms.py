"""An arm: one speculation policy on one topology, served by one kind of engine."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

import serve_apps.engine_kinds  # noqa: F401 (registers the built-in kinds before the union is built)
from serve_apps.engine_kinds.base import EngineConfigBase
from serve_apps.engine_kinds.registry import bind_engine_field, config_union, kind_of
from serve_apps.placement import plan_placement
from serve_apps.policies import Policy, Topology
from serve_apps.policy_kinds import facts, vllm_policy
from serve_apps.resources import Resources

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


class ArmSpec(_Strict):
    name: str
    campaign: str = "default"
    policy: Policy
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
        kind = kind_of(self.engine)
        if not facts(self.policy.kind).runs_on_vllm and kind.deploys_in_serve and kind.simulation(self.engine) is None:
            vllm_policy(self.policy)  # another engine's design on a vLLM engine: refused, naming whose it is
        plan_placement(self)  # raises PlacementError (a ValueError) naming the limitation
        kind.check_arm(self)  # a knob the kind cannot run, in one line
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
