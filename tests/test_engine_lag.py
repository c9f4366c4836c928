"""Engine lag: the real-time simulated engine says when the host could not keep up with its step schedule."""

from __future__ import annotations

import asyncio

from serve_apps.policies import FixedPolicy
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.realtime import Finished, RealtimeEngine
from serve_apps.sim.request import SimRequest


def _run(profile: Profile, time_scale: float) -> RealtimeEngine:
    async def scenario() -> RealtimeEngine:
        engine = RealtimeEngine(EngineCore(profile, FixedPolicy(method="eagle", model="d", k=3).resolve(), seed=1),
                                time_scale=time_scale)  # fmt: skip

        async def one(i: int) -> None:
            async for item in engine.generate(SimRequest(f"r{i}", "chat", 64, 30, 0.0)):
                if isinstance(item, Finished):
                    return

        try:
            await asyncio.gather(*(one(i) for i in range(4)))
        finally:
            await engine.stop()
        return engine

    return asyncio.run(scenario())


def test_every_step_has_its_lag_and_an_impossible_pace_shows_as_lag(eagle_profile: Profile) -> None:
    # Steps of a few microseconds of wall time: far faster than this interpreter can hand out tokens.
    engine = _run(eagle_profile, time_scale=1e-4)
    steps = engine.core.steps.count
    assert steps > 0 and len(engine.step_lag) == steps
    assert min(engine.step_lag) >= 0.0
    step_wall = (engine.core.steps.column("end") - engine.core.steps.column("start")) * 1e-4
    late = sum(1 for lag, wall in zip(engine.step_lag, step_wall, strict=True) if lag > wall)
    assert late >= steps // 2  # most steps ended later than the model says: the latencies are the host's
    assert engine.max_lag == max(engine.step_lag)
