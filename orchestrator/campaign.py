"""The campaign file: what to deploy (engine, policies, topologies) and where Serve listens.

This is the minimal schema the deploy step needs; traffic, phases and the report extend it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serve_apps.arms import ArmSpec, EngineConfig, Resources, SimulatedEngineConfig
from serve_apps.config_io import first_error, load_yaml_model
from serve_apps.policies import PolicyError, Topology, parse_policy, parse_topology
from serve_apps.sim.profile import load_profile


class CampaignError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServeConfig(_Strict):
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8000, ge=1, le=65535)


def _topology(value: Any) -> Any:
    """The short form (parse_topology) or a mapping {kind, size, tensor_parallel_size}."""
    if isinstance(value, str):
        try:
            return parse_topology(value)
        except ValueError as exc:
            raise ValueError(f"{exc} or a mapping") from None
    return value


class ArmSelection(_Strict):
    policy: str
    topology: str


class Campaign(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    engine: EngineConfig
    policies: dict[str, Any] = Field(min_length=1)
    topologies: dict[str, Annotated[Topology, Field()]] = Field(default_factory=lambda: {"single": Topology()})
    resources: Resources = Resources()
    serve: ServeConfig = ServeConfig()
    # Which (policy, topology) pairs become arms; default: every policy on every topology.
    arms_only: list[ArmSelection] | None = Field(default=None, alias="arms", min_length=1)

    @field_validator("policies", "topologies", mode="before")
    @classmethod
    def _string_keys(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for key in v:
                if isinstance(key, bool):
                    raise ValueError(
                        f'name {key!r} is a YAML boolean: quote it ("off": ...), YAML reads off/on/yes/no as booleans'
                    )
        return v

    @field_validator("topologies", mode="before")
    @classmethod
    def _topologies(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {name: _topology(t) for name, t in v.items()}
        return v

    @model_validator(mode="after")
    def _arms_valid(self) -> Campaign:
        self.arms()  # every policy must parse against the engine, every arm name must be a valid slug
        return self

    def _default_drafter(self) -> tuple[str, str | None]:
        if isinstance(self.engine, SimulatedEngineConfig):
            profile = load_profile(self.engine.profile)
            return profile.drafter_method, profile.drafter_model
        return "ngram", None

    def arms(self) -> list[ArmSpec]:
        method, drafter = self._default_drafter()
        wanted = None
        if self.arms_only is not None:
            wanted = set()
            for i, pick in enumerate(self.arms_only):
                if pick.policy not in self.policies:
                    raise ValueError(f"arms.{i}: no policy named {pick.policy!r}")
                if pick.topology not in self.topologies:
                    raise ValueError(f"arms.{i}: no topology named {pick.topology!r}")
                wanted.add((pick.policy, pick.topology))
        arms = []
        for policy_name, raw in self.policies.items():
            # A policy is the CLI short form ("fixed:3") or a mapping in vLLM's terms ({kind: dynamic, ...}).
            policy: Any = raw
            if isinstance(raw, str):
                try:
                    policy = parse_policy(raw, default_method=method, default_model=drafter)
                except PolicyError as exc:
                    raise ValueError(f"policies.{policy_name}: {exc}") from None
            for topo_name, topology in self.topologies.items():
                if wanted is not None and (policy_name, topo_name) not in wanted:
                    continue
                data: dict[str, Any] = {
                    "name": f"{policy_name}-{topo_name}",
                    "campaign": self.name,
                    "policy": policy,
                    "topology": topology,
                    "engine": self.engine,
                    "resources": self.resources,
                }
                try:
                    arms.append(ArmSpec.model_validate(data))
                except ValidationError as exc:
                    raise ValueError(f"policies.{policy_name} on topologies.{topo_name}: {first_error(exc)}") from None
        return arms


def load_campaign(path: str | Path) -> Campaign:
    p = Path(path)
    if not p.is_file():
        raise CampaignError(f"campaign file {p} does not exist")
    return load_yaml_model(p.read_text(), Campaign, origin=f"campaign {p}", error=CampaignError)
