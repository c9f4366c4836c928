"""Build the engine an arm asks for."""

from __future__ import annotations

from serve_apps.arms import ArmSpec, SimulatedEngineConfig
from serve_apps.engines.base import Engine
from serve_apps.sim.profile import load_profile


def build_engine(arm: ArmSpec, *, engine_id: str, seed_offset: int = 0, probe: bool = False) -> Engine:
    if probe:
        from serve_apps.engines.placement_probe import PlacementProbeEngine

        return PlacementProbeEngine(arm, engine_id=engine_id)
    if isinstance(arm.engine, SimulatedEngineConfig):
        from serve_apps.engines.simulated import SimulatedEngine

        profile = load_profile(arm.engine.profile)
        return SimulatedEngine(
            profile,
            arm.policy.resolve(arm.topology),
            seed=arm.engine.seed + seed_offset,
            time_scale=arm.engine.time_scale,
            engine_id=engine_id,
            max_model_len=arm.engine.max_model_len,
        )
    from serve_apps.engines.vllm_engine import VllmEngine

    engine: Engine = VllmEngine(arm, engine_id=engine_id)
    return engine
