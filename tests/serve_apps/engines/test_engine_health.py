"""An engine that can serve nothing more says so: its health check fails (Serve then replaces the replica) and
every request in flight or sent later fails with the reason, instead of hanging."""

from __future__ import annotations

import asyncio

import pytest

from serve_apps.arms import ArmSpec
from serve_apps.engine_kinds.simulated import SimulatedEngineConfig
from serve_apps.engines.base import EngineDead, GenerationInput, GenerationResult
from serve_apps.engines.simulated import SimulatedEngine
from serve_apps.policies import FixedPolicy
from serve_apps.service import ArmService, Placement
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile


def _request(i: int, tokens: int = 400) -> GenerationInput:
    return GenerationInput(request_id=f"r{i}", prompt_text="a b c d", prompt_token_ids=None, max_tokens=tokens,
                           ignore_eos=True)  # fmt: skip


def _breaks_after(steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated engine's loop raises in its step after `steps` (a fault inside the loop)."""
    run_steps = EngineCore.run_steps
    seen = {"n": 0}

    def breaking(self: EngineCore, *args: object, **kwargs: object) -> object:
        seen["n"] += 1
        if seen["n"] > steps:
            raise MemoryError("KV block table corrupted")
        return run_steps(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(EngineCore, "run_steps", breaking)


def test_a_simulated_engine_whose_loop_died_fails_its_health_check_and_its_requests(
    eagle_profile: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = SimulatedEngine(
        eagle_profile, FixedPolicy(method="eagle", model="d", k=3).resolve(), seed=1, time_scale=1.0,
        engine_id="arm/replica",
    )  # fmt: skip
    _breaks_after(5, monkeypatch)

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
        events: list[object] = [event async for event in engine.generate(_request(0, tokens=8))]
        await engine.check_health()
        await engine.stop()
        return events

    events = asyncio.run(scenario())
    assert isinstance(events[-1], GenerationResult) and events[-1].completion_tokens == 8


def test_a_stream_whose_engine_dies_ends_with_openais_error_event(
    eagle_profile: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    arm = ArmSpec(name="fixed3-single", policy=FixedPolicy(method="eagle", model="d", k=3),
                  engine=SimulatedEngineConfig())  # fmt: skip
    engine = SimulatedEngine(eagle_profile, arm.policy.resolve(), seed=1, time_scale=1.0, engine_id="e")
    service = ArmService(arm, engine, Placement("r", "n", "127.0.0.1"), {})
    _breaks_after(5, monkeypatch)

    async def scenario() -> list[str]:
        await engine.start()
        events = [e async for e in service.stream(_request(0), chat=False, include_usage=True, received=0.0)]
        await engine.stop()
        return events

    events = asyncio.run(scenario())
    assert events[-1] == "data: [DONE]\n\n"
    assert events[-2] == (
        'data: {"error":{"message":"the simulated engine\'s loop died: MemoryError: KV block table corrupted",'
        '"type":"engine_dead","param":null,"code":503}}\n\n'
    )
    assert len(events) > 2  # tokens streamed before the loop died
