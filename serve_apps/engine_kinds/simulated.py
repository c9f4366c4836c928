"""The simulated engine: a fitted cost model of a real one (a profile), served in Serve in real time or run in
virtual time by `specdrill simulate`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from serve_apps.config_io import derived
from serve_apps.engine_kinds.base import EngineConfigBase, EngineKind, ServedArm, Simulation
from serve_apps.engine_kinds.registry import register
from serve_apps.sim.profile import load_profile

SIMULATION = "_simulation"  # where a config holds its Simulation (config_io.derived)


class SimulatedEngineConfig(EngineConfigBase):
    kind: Literal["simulated"] = "simulated"
    profile: str = "llama3.1-8b-h100-eagle"
    time_scale: float = Field(default=1.0, gt=0)
    seed: int = 0
    max_model_len: int = Field(default=8192, ge=16)


def as_simulated(config: EngineConfigBase) -> SimulatedEngineConfig:
    """The config of a campaign a command requires to be simulated (the command refused any other kind)."""
    if not isinstance(config, SimulatedEngineConfig):
        raise TypeError(f"engine kind {config.kind} is not simulated")
    return config


class SimulatedKind(EngineKind):
    name = "simulated"
    config = SimulatedEngineConfig
    runs_in_virtual_time = True

    def simulation(self, config: EngineConfigBase) -> Simulation:
        sim = as_simulated(config)
        # Held by the config: a loaded campaign's arms share its one engine config, so the profile's file is read
        # once per campaign load, not once per arm or unit (a copy with another profile reads its own).
        return derived(sim, SIMULATION, (sim.profile, sim.time_scale, sim.max_model_len, sim.seed), lambda: Simulation(
            profile=load_profile(sim.profile), time_scale=sim.time_scale, max_model_len=sim.max_model_len,
            seed=sim.seed,
        ))  # fmt: skip

    def served_model_name(self, config: EngineConfigBase) -> str:
        return f"sim-{as_simulated(config).profile}"

    def check_arm(self, arm: ServedArm) -> None:
        # Synthetic acceptance is modelled exactly (serve_apps/sim/synthetic.py). What the others change is not in
        # a profile: block verification's and FLy's acceptance depend on the models' distributions, a quantized
        # drafter head on the weights, and the simulator has no data-parallel wave to throttle prefills in.
        policy = arm.policy
        method = getattr(policy, "rejection_sample_method", "standard")
        if method in {"block", "fly"}:
            raise ValueError(
                f"rejection_sample_method {method!r}: the simulator cannot model its acceptance (it depends on the "
                "models' distributions); use a vLLM arm, or 'synthetic' to set rates"
            )
        if getattr(policy, "draft_lm_head_quantization", None) is not None:
            raise ValueError(
                "draft_lm_head_quantization: the simulator cannot model a quantized drafter head's acceptance (no "
                "weights); use a vLLM arm"
            )
        if arm.topology.prefill_schedule_interval != 1:
            raise ValueError(
                "prefill_schedule_interval: the simulator has no data-parallel engine core whose prefills it would "
                "throttle; use a vLLM arm"
            )

    def max_model_len(self, config: EngineConfigBase) -> int | None:
        return as_simulated(config).max_model_len

    def time_scale(self, config: EngineConfigBase) -> tuple[float, str] | None:
        sim = as_simulated(config)
        return sim.time_scale, sim.profile


KIND = register(SimulatedKind())
