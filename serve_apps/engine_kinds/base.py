"""What an engine kind declares: its config model and how each part of specdrill treats engines of that kind."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from serve_apps.engine_kinds.dialects import vllm as vllm_dialect
from serve_apps.engine_kinds.dialects.base import Dialect
from serve_apps.engines.base import Engine
from serve_apps.policies import AnyPolicy, Topology
from serve_apps.resources import Resources
from serve_apps.sim.profile import Profile


class EngineConfigBase(BaseModel):
    """The campaign's `engine:` section; each kind's config sets `kind` to its own literal name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str


class ServedArm(Protocol):
    """What a kind reads of the arm whose engine it builds (serve_apps.arms.ArmSpec, named by shape: arms imports
    the registry, so the registry does not import arms). It holds placement's PlacedArm (serve_apps/placement.py):
    an engine that lays out its own workers (vLLM) plans the arm's placement in its replica."""

    @property
    def name(self) -> str: ...
    @property
    def resources(self) -> Resources: ...
    @property
    def engine(self) -> EngineConfigBase: ...
    @property
    def policy(self) -> AnyPolicy: ...
    @property
    def topology(self) -> Topology: ...


@dataclass(frozen=True)
class Simulation:
    """What a simulated engine core is built from, for an engine that can run in virtual time."""

    profile: Profile
    time_scale: float
    max_model_len: int
    seed: int


# How a unit's engine behaviour is verified: the step timelines the arm's replicas record (fetched from
# specdrill's own endpoints), or the server's Prometheus /metrics sampled while the unit runs.
Telemetry = Literal["step_timeline", "server_metrics"]


class EngineKind:
    """Defaults describe an engine specdrill deploys in Serve and whose replicas record a step timeline."""

    name: ClassVar[str]
    config: ClassVar[type[EngineConfigBase]]
    deploys_in_serve: ClassVar[bool] = True
    telemetry: ClassVar[Telemetry] = "step_timeline"
    # What its servers say about speculation (per request, and on /metrics for a server_metrics kind): vLLM's,
    # which specdrill's own servers answer in too.
    dialect: ClassVar[Dialect] = vllm_dialect.DIALECT
    deploy_timeout_s: ClassVar[float] = 180.0  # until every replica is up and answered, when not given
    # The engine starts its own tensor-parallel workers and data-parallel ranks (one Serve replica per DP group,
    # an executor backend placement chooses), as vLLM does; otherwise each DP rank is a replica of its own.
    spawns_workers: ClassVar[bool] = False
    # Arms can be added to the campaign (search adds an `off` arm); servers someone else runs cannot be.
    can_add_arms: ClassVar[bool] = True
    # simulation() gives a cost model: `specdrill simulate`, search and tune can run it in virtual time.
    runs_in_virtual_time: ClassVar[bool] = False

    def simulation(self, config: EngineConfigBase) -> Simulation | None:
        return None

    def served_model_name(self, config: EngineConfigBase) -> str:
        raise NotImplementedError

    def prompt_tokenizer(self, config: EngineConfigBase) -> str | None:
        """Whose tokens a prompt length counts; None: words."""
        return None

    def tokenizer_field(self, config: EngineConfigBase) -> str:
        """The campaign field that named prompt_tokenizer(config), for the line refusing it."""
        return "engine.tokenizer"

    def prompt_length_notice(self, config: EngineConfigBase) -> str | None:
        return None

    def max_num_seqs(self, config: EngineConfigBase) -> int | None:
        """The config's own max_num_seqs (a simulation's comes from its profile); None: vLLM's default."""
        return None

    def max_model_len(self, config: EngineConfigBase) -> int | None:
        return None

    def time_scale(self, config: EngineConfigBase) -> tuple[float, str] | None:
        """A modelled engine slowed (or sped up) against its model: (factor, the model's name), every step taking
        factor times the modelled hardware's time; None: the engine runs at its hardware's own speed."""
        return None

    def loaded_model(self, config: EngineConfigBase) -> str | None:
        """The model whose weights this kind's engines load on the cluster's nodes (what `models pull` fetches)."""
        return None

    def urls(self, config: EngineConfigBase) -> dict[str, str]:
        """Arm name -> base URL of servers running elsewhere; {} for a kind deployed in Serve."""
        return {}

    def api_key_env(self, config: EngineConfigBase) -> str | None:
        return None

    def check_arm_names(self, config: EngineConfigBase, names: set[str]) -> None:
        """Raises ValueError when the config does not fit the campaign's arms."""

    def for_arms(self, config: EngineConfigBase, names: set[str]) -> EngineConfigBase:
        """The config of a campaign cut down to the named arms (search runs two): what named the others goes."""
        return config

    def check_arm(self, arm: ServedArm) -> None:
        """Raises ValueError (one line) when this kind cannot run the arm as written (a knob it cannot model)."""

    def replica_env(self, config: EngineConfigBase) -> dict[str, str]:
        return {}

    def arm_warnings(self, config: EngineConfigBase, arms: Sequence[ServedArm]) -> list[str]:
        """What the engine will run differently from how arms are written (one line each), said at validation."""
        return []

    def gpu_memory_share(self, config: EngineConfigBase) -> tuple[float, str] | None:
        """The share of a GPU's memory each engine takes, and where that share was set; None: not sized so."""
        return None

    def build_engine(self, arm: ServedArm, *, engine_id: str, seed_offset: int) -> Engine:
        """The engine a Serve replica of the arm runs."""
        setup = self.simulation(arm.engine)
        if setup is None:
            raise NotImplementedError(f"engine kind {self.name} has no engine to run in a Serve replica")
        from serve_apps.engines.simulated import SimulatedEngine
        from serve_apps.sim.synthetic import arm_profile

        return SimulatedEngine(
            arm_profile(setup.profile, arm.policy),
            arm.policy.resolve(arm.topology),
            seed=setup.seed + seed_offset,
            time_scale=setup.time_scale,
            engine_id=engine_id,
            max_model_len=setup.max_model_len,
        )
