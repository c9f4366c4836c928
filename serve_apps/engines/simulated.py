"""The simulated engine behind an arm: the calibrated model in real time, with vLLM's telemetry shapes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from serve_apps.engines.base import EngineDead, GenerationInput, GenerationResult, TextDelta
from serve_apps.policies import ResolvedSpeculation
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import Profile
from serve_apps.sim.realtime import Finished, LoopDied, RealtimeEngine, TokenBatch
from serve_apps.sim.request import SimRequest

_WORDS = ("the", " model", " drafts", " tokens", " and", " the", " target", " verifies", " them", ".")


def simulated_text(start: int, count: int) -> str:
    return "".join(_WORDS[(start + i) % len(_WORDS)] for i in range(count))


class SimulatedEngine:
    kind = "simulated"

    def __init__(
        self,
        profile: Profile,
        speculation: ResolvedSpeculation,
        *,
        seed: int,
        time_scale: float,
        engine_id: str,
        max_model_len: int = 8192,
    ) -> None:
        self.engine_id = engine_id
        self.profile = profile
        self.speculation = speculation
        self.max_model_len = max_model_len
        self._core = EngineCore(profile, speculation, seed=seed, engine_id=engine_id)
        self._realtime = RealtimeEngine(self._core, time_scale=time_scale)

    async def start(self) -> None:
        self._realtime.start()

    async def stop(self) -> None:
        await self._realtime.stop()

    def begin_unit(self) -> None:
        self._core.begin_unit()

    async def check_health(self) -> None:
        if self._realtime.failure is not None:
            raise EngineDead(str(self._realtime.failure))

    def _prompt_tokens(self, request: GenerationInput) -> int:
        if request.prompt_tokens_hint is not None:
            return request.prompt_tokens_hint
        if request.prompt_token_ids is not None:
            return max(1, len(request.prompt_token_ids))
        return max(1, len((request.prompt_text or "").split()))

    async def generate(self, request: GenerationInput) -> AsyncIterator[TextDelta | GenerationResult]:
        prompt_tokens = self._prompt_tokens(request)
        if prompt_tokens + request.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({prompt_tokens} tokens) + max_tokens ({request.max_tokens}) exceeds max_model_len "
                f"{self.max_model_len}"
            )
        sim = SimRequest(
            request_id=request.request_id,
            category=request.category,
            prompt_tokens=prompt_tokens,
            max_tokens=request.max_tokens,
            arrival=0.0,
            stop_at=None if request.ignore_eos else request.output_tokens_hint,
        )
        produced = 0
        try:
            async for item in self._realtime.generate(sim):
                if isinstance(item, TokenBatch):
                    yield TextDelta(
                        text=simulated_text(produced, item.count), tokens=item.count, time=item.time,
                        prompt_tokens=prompt_tokens,
                    )  # fmt: skip
                    produced += item.count
                elif isinstance(item, Finished):
                    r = item.record
                    yield GenerationResult(
                        prompt_tokens=prompt_tokens,
                        completion_tokens=r.output_tokens,
                        finish_reason=r.finish_reason,
                        spec_decode_metrics=r.spec_decode_metrics(),
                        first_scheduled=r.first_scheduled,
                        first_token=r.first_token,
                        finished=r.finished,
                        queue_wait=r.queue_wait,
                        step_batch_sizes=[int(x) for x in r.step_batch_size],
                        step_k=[int(x) for x in r.step_k],
                        engine_id=self.engine_id,
                    )
        except LoopDied as exc:
            raise EngineDead(str(exc)) from exc

    def resolved_speculative_config(self) -> dict[str, Any] | None:
        s = self.speculation
        if s.method is None:
            return None
        return {
            "method": s.method,
            "num_speculative_tokens": s.num_speculative_tokens,
            "num_speculative_tokens_per_batch_size": [list(e) for e in s.schedule] if s.schedule else None,
        }

    def timeline(self, since_step: int = 0) -> dict[str, list[Any]]:
        steps = self._core.steps
        out: dict[str, list[Any]] = {}
        for name in ("start", "end"):
            out[name] = [self._realtime.to_wall(float(t)) for t in steps.column(name)[since_step:]]
        for name in ("batch_size", "k", "drafted", "accepted", "waiting", "num_prefill", "batched_tokens", "kv_tokens"):
            out[name] = [int(x) for x in steps.column(name)[since_step:]]
        # One engine per replica: a simulated DP rank is its own replica, so within an engine the rank is 0.
        out["dp_rank"] = [0] * len(out["start"])
        # Wall seconds each step's tokens went out after the model's step end: where this host fell behind the
        # model, the latencies measured there are the host's (the report flags such units).
        out["lag_s"] = list(self._realtime.step_lag[since_step : since_step + len(out["start"])])
        return out

    def live(self) -> dict[str, float]:
        steps = self._core.steps
        last_k = float(steps.column("k")[-1]) if steps.count else 0.0
        return {"running": float(self._core.n_run), "waiting": float(len(self._core.waiting)), "k": last_k}

    def versions(self) -> dict[str, str]:
        return {"engine": f"specdrill-simulated/{self.profile.name}"}
