"""Build the engine an arm asks for."""

from __future__ import annotations

from serve_apps.arms import ArmSpec
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.engines.base import Engine


def build_engine(arm: ArmSpec, *, engine_id: str, seed_offset: int = 0, probe: bool = False) -> Engine:
    if probe:
        from serve_apps.engines.placement_probe import PlacementProbeEngine

        return PlacementProbeEngine(arm, engine_id=engine_id)
    return kind_of(arm.engine).build_engine(arm, engine_id=engine_id, seed_offset=seed_offset)
