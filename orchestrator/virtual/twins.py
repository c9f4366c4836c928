"""The engines of an arm in virtual time: one simulated engine core per rank, each saying who it is exactly as
the arm's server would say it on every response."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import serve_apps
from loadshapes.sse import StreamResult, telemetry_columns
from orchestrator.rundir.layout import Unit
from serve_apps.arms import ArmSpec
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.engines.simulated import SimulatedEngine
from serve_apps.service import ArmService, Placement
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.synthetic import arm_profile

NODE_ID = "virtual"


@dataclass(frozen=True)
class VirtualEngine:
    """One rank of an arm: who it says it is, exactly as the arm's server would say it on every response."""

    rank: int
    engine_id: str
    info: dict[str, Any]  # ArmService.info(): what the manifest's arm entry is built from
    constant_columns: dict[str, Any]  # the trace columns that are the same on every response of this engine
    dp_rank: int = 0  # its rank in a vLLM data-parallel group; replicas and a single engine are each rank 0


@dataclass(frozen=True)
class ArmModel:
    arm: ArmSpec
    profile: Profile
    time_scale: float
    max_model_len: int
    seed: int
    engines: list[VirtualEngine]

    def core(self, rank: int, unit: Unit) -> EngineCore:
        """A fresh engine per unit: a unit's result does not depend on which units ran before it (resume)."""
        key = zlib.crc32(f"{unit.shape}:{unit.repeat}:{rank}".encode())
        return EngineCore(
            self.profile,
            self.arm.policy.resolve(self.arm.topology),
            seed=self.seed + key,
            engine_id=self.engines[rank].engine_id,
        )


def engines_of(arm: ArmSpec) -> int:
    """Engines of the arm: its replicas, or a vLLM data-parallel group's ranks."""
    return 1 if arm.topology.kind == "single" else arm.topology.size


def arm_model(arm: ArmSpec) -> ArmModel:
    """The arm's engines, each with the telemetry its real-time twin (serve_apps.engines.simulated) reports."""
    config = kind_of(arm.engine).simulation(arm.engine)
    assert config is not None, "virtual time runs kinds with a simulation (require_simulated)"
    profile = arm_profile(config.profile, arm.policy)  # a synthetic-acceptance arm's rates replace the profile's
    resolved = arm.policy.resolve(arm.topology)  # DP > 1 drops the schedule, as vLLM does
    engines = []
    for rank in range(engines_of(arm)):
        replica_id = f"sim-{rank}"
        engine_id = f"{arm.name}-{replica_id}"
        twin = SimulatedEngine(
            profile, resolved, seed=config.seed, time_scale=config.time_scale, engine_id=engine_id,
            max_model_len=config.max_model_len,
        )  # fmt: skip
        service = ArmService(
            arm, twin, Placement(replica_id=replica_id, node_id=NODE_ID, node_ip=NODE_ID),
            {"specdrill": serve_apps.__version__},
        )  # fmt: skip
        info = service.info()
        # The same flattening the load worker applies to a response's telemetry; only the per-engine part is used.
        columns = telemetry_columns(StreamResult(telemetry={**info, "engine_id": engine_id}))
        constant = {k: columns[k] for k in ("resolved_speculative_config", "schedule_dropped", "replica_id",
                                            "engine_id", "node_id")}  # fmt: skip
        dp_rank = rank if arm.topology.kind == "data_parallel" else 0
        engines.append(
            VirtualEngine(rank=rank, engine_id=engine_id, info=info, constant_columns=constant, dp_rank=dp_rank)
        )
    return ArmModel(
        arm=arm, profile=profile, time_scale=config.time_scale, max_model_len=config.max_model_len,
        seed=config.seed, engines=engines,
    )  # fmt: skip
