"""An engine that can serve nothing more says so: its health check fails (Serve then replaces the replica) and
every request in flight or sent later fails with the reason, instead of hanging."""

from __future__ import annotations

import asyncio

import pytest

from serve_apps.engines.base import EngineDead, GenerationInput, GenerationResult
from serve_apps.engines.simulated import SimulatedEngine
from serve_apps.policies import FixedPolicy
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile


def _request(i: int, tokens: int = 400) -> GenerationInput:
    return GenerationInput(request_id=f"r{i}", prompt_text="a b c d", prompt_token_ids=None, max_tokens=tokens,
                           ignore_eos=True)  # fmt: skip


def test_a_simulated_engine_whose_loop_died_fails_its_health_check_and_its_requests(
    eagle_profile: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = SimulatedEngine(
        eagle_profile, FixedPolicy(method="eagle", model="d", k=3).resolve(), seed=1, time_scale=1.0,
        engine_id="arm/replica",
    )  # fmt: skip
    run_steps = EngineCore.run_steps
    steps = {"n": 0}

    def breaks_after_five_steps(self: EngineCore, *args: object, **kwargs: object) -> object:
        steps["n"] += 1
        if steps["n"] > 5:
            raise MemoryError("KV block table corrupted")  # any exception inside the loop
        return run_steps(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(EngineCore, "run_steps", breaks_after_five_steps)

    async def scenario() -> tuple[list[BaseException | list[object]], str, str]:
        await engine.start()
        await engine.check_health()  # healthy while the loop runs

        async def consume(i: int) -> list[object]:
            return [event async for event in engine.generate(_request(i))]

        in_flight = await asyncio.wait_for(asyncio.gather(*(consume(i) for i in range(3)), return_exceptions=True), 30)
        with pytest.raises(EngineDead) as health:
            await engine.check_health()
        with pytest.raises(EngineDead) as later:
            await consume(9)
        await engine.stop()  # stopping a dead engine is quiet
        return in_flight, str(health.value), str(later.value)

    in_flight, health, later = asyncio.run(scenario())
    expected = "the simulated engine's loop died: MemoryError: KV block table corrupted"
    assert health == later == expected
    assert all(isinstance(r, EngineDead) and str(r) == expected for r in in_flight), in_flight


def test_a_healthy_simulated_engine_passes_its_health_check_after_serving(eagle_profile: Profile) -> None:
    engine = SimulatedEngine(
        eagle_profile, FixedPolicy(method="eagle", model="d", k=3).resolve(), seed=1, time_scale=1.0,
        engine_id="arm/replica",
    )  # fmt: skip

    async def scenario() -> list[object]:
        await engine.start()
        events = [event async for event in engine.generate(_request(0, tokens=8))]
        await engine.check_health()
        await engine.stop()
        return events

    events = asyncio.run(scenario())
    assert isinstance(events[-1], GenerationResult) and events[-1].completion_tokens == 8
