"""A real vLLM engine behind an arm: AsyncLLM with the arm's speculative config and per-request metrics.

What ran comes from vLLM itself: per-request `spec_decode_metrics` (per_request_spec_decode_metrics="detailed"),
the config read back from the engine after vLLM finalised it (speculative config, CUDA-graph mode, the warning
vLLM logged when it dropped a schedule), and a stat logger per data-parallel rank that sees every engine step
(requests scheduled, drafts verified and accepted, which requests finished).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from serve_apps.engine_kinds.base import ServedArm
from serve_apps.engine_kinds.vllm_config import as_vllm
from serve_apps.engines.base import EngineDead, GenerationInput, GenerationResult, TextDelta
from serve_apps.engines.step_timeline import StepTimeline
from serve_apps.engines.vllm_stats import (
    can_skip_drafts,
    captured_vllm_warnings,
    draft_limit_warning,
    max_model_len_facts,
    resolved_engine_facts,
    stat_logger_factory,
)
from serve_apps.policy_kinds import vllm_policy
from serve_apps.vllm_versions import VllmTarget
from timebase import clock


def rank_engine_id(engine_id: str, rank: int, data_parallel_size: int) -> str:
    """The id of one DP rank's engine: the replica's engine id, with the rank when there are several."""
    return engine_id if data_parallel_size <= 1 else f"{engine_id}/dp{rank}"


class VllmEngine:
    kind = "vllm"

    def __init__(self, arm: ServedArm, *, engine_id: str) -> None:
        self.arm = arm
        self.config = as_vllm(arm.engine)
        self.engine_id = engine_id
        self.data_parallel_size = arm.topology.data_parallel_size
        self.timeline_data = StepTimeline(speculative=vllm_policy(arm.policy).to_vllm_speculative_config() is not None)
        self.schedule_dropped_reason: str | None = None
        self.max_model_len_warning: str | None = None  # vLLM's, when it lowered max_model_len to the drafter's
        self._llm: Any = None
        self._target: VllmTarget | None = None  # the vLLM the engine started on

    def rank_engine_ids(self) -> dict[int, str]:
        return {r: rank_engine_id(self.engine_id, r, self.data_parallel_size) for r in range(self.data_parallel_size)}

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        cfg = self.config
        speculative = vllm_policy(self.arm.policy).to_vllm_speculative_config()
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "dtype": cfg.dtype,
            "enforce_eager": cfg.enforce_eager,
            "seed": cfg.seed,
            "speculative_config": speculative,
            "data_parallel_size": self.arm.topology.data_parallel_size,
            "tensor_parallel_size": self.arm.topology.tensor_parallel_size,
            # The step timeline needs each step's scheduled requests and timing (vLLM's iteration details); the
            # engine is built with vLLM's default loggers off (start()), so these are not printed every step.
            "enable_logging_iteration_details": True,
        }
        if speculative is not None:  # vLLM refuses per-request spec metrics without speculation
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        if self.arm.topology.prefill_schedule_interval != 1:  # the topology's (serve_apps/policies.py)
            kwargs["prefill_schedule_interval"] = self.arm.topology.prefill_schedule_interval
        if cfg.served_model_name:
            kwargs["served_model_name"] = cfg.served_model_name
        if cfg.max_model_len is not None:
            kwargs["max_model_len"] = cfg.max_model_len
        if cfg.max_num_seqs is not None:
            kwargs["max_num_seqs"] = cfg.max_num_seqs
        kwargs.update(self.placement_engine_args())
        kwargs.update(cfg.engine_kwargs)
        return AsyncEngineArgs(**kwargs)

    # --- placement hook: serve_apps/engines/vllm_placement.py decides the layout (owned there, not here) -------
    def placement_engine_args(self) -> dict[str, Any]:
        """AsyncEngineArgs fields the arm's layout decides (vLLM's executor and data-parallel backends)."""
        from serve_apps.engines.vllm_placement import placement_engine_args

        return placement_engine_args(self.arm)

    def attach_placement(self, vllm_config: Any) -> None:
        """Hand vLLM what the layout needs on the finalised config (the placement group of a spanning layout)."""
        from serve_apps.engines.vllm_placement import attach_placement_group

        attach_placement_group(vllm_config, self.arm)

    # -----------------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._llm is not None:
            return
        # No forced offline mode: a fresh cluster downloads (or finds in HF_HOME) its models; tests set it in env.
        from serve_apps.engines.vllm_support import require_tested_vllm

        self._target = require_tested_vllm(os.environ, getattr(self.arm.policy, "method", None), self.arm.policy)
        from vllm.v1.engine.async_llm import AsyncLLM

        args = self.engine_args()
        # What vLLM will run: the config it finalises (the DP fallback applies here), not what the arm asked for.
        # The engine is built from this same config, and the warnings vLLM logs while finalising it are kept.
        with captured_vllm_warnings() as warnings:
            vllm_config = args.create_engine_config()
        # Either drop's warning (data parallelism; 0.33's model runner V1) names that key: serve_apps/vllm_versions.py
        self.schedule_dropped_reason = next((w for w in warnings if "num_speculative_tokens_per_batch_size" in w), None)
        self.max_model_len_warning = draft_limit_warning(warnings)
        self.attach_placement(vllm_config)
        self.timeline_data.async_scheduling = bool(vllm_config.scheduler_config.async_scheduling)
        self.timeline_data.can_skip_drafts = can_skip_drafts(vllm_config)
        spec = vllm_config.speculative_config
        max_seqs = vllm_config.scheduler_config.max_num_seqs
        if spec is None:
            k_table = [0] * (max_seqs + 1)
        elif spec.num_speculative_tokens_per_batch_size:
            from serve_apps.policies import dense_schedule, validate_schedule

            schedule = validate_schedule([list(e) for e in spec.num_speculative_tokens_per_batch_size])
            k_table = dense_schedule(schedule, max_seqs, spec.num_speculative_tokens)
        else:
            k_table = [0] + [spec.num_speculative_tokens] * max_seqs
        self._llm = AsyncLLM.from_vllm_config(
            vllm_config,
            stat_loggers=[
                stat_logger_factory(
                    self.timeline_data,
                    k_table,
                    with_details=bool(vllm_config.observability_config.enable_logging_iteration_details),
                )
            ],
            enable_log_requests=args.enable_log_requests,
            # Our logger still gets every step (vLLM keeps stats on for custom loggers); vLLM's own logging
            # logger would print every step's iteration details.
            disable_log_stats=True,
        )

    async def stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    async def check_health(self) -> None:
        """AsyncLLM's own check: `errored` is set when vLLM's monitor thread sees an engine core process exit
        (core_client.py, MPClient.start_engine_core_monitor) or its output handler stopped."""
        if self._llm is not None and self._llm.errored:
            raise EngineDead(f"vLLM engine {self.engine_id}: {self._llm.dead_error}")

    async def generate(self, request: GenerationInput) -> AsyncIterator[TextDelta | GenerationResult]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        await self.start()
        params = SamplingParams(
            max_tokens=request.max_tokens,
            ignore_eos=request.ignore_eos,
            seed=request.seed,
            temperature=request.temperature,
            output_kind=RequestOutputKind.DELTA,
        )
        prompt: Any = (
            {"prompt_token_ids": request.prompt_token_ids}
            if request.prompt_token_ids is not None
            else (request.prompt_text or "")
        )
        first_token: float | None = None
        completion_tokens = 0
        # vLLM raises its EngineDeadError to every request in flight when the engine core dies: the replica's
        # error rows then say what died, and its health check fails (check_health).
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            async for out in self._llm.generate(prompt, params, request.request_id):
                completion = out.outputs[0]
                n = len(completion.token_ids)
                if n:
                    now = clock.now()
                    first_token = first_token if first_token is not None else now
                    completion_tokens += n
                    prompt_tokens = len(out.prompt_token_ids or [])
                    yield TextDelta(text=completion.text, tokens=n, time=now, prompt_tokens=prompt_tokens)
                if out.finished:
                    done = clock.now()
                    stats = out.metrics
                    queued = getattr(stats, "queued_ts", 0.0) if stats is not None else 0.0
                    scheduled = getattr(stats, "scheduled_ts", 0.0) if stats is not None else 0.0
                    ttft = getattr(stats, "first_token_latency", None) if stats is not None else None
                    first_scheduled = clock.from_monotonic(scheduled) if scheduled else None
                    spec = completion.spec_decode_metrics
                    # Which DP rank served the request, and its last step: from the stat logger of the rank whose
                    # step reported the request finished (vLLM's iteration stats carry the finished request ids).
                    where = await self.timeline_data.finished(request.request_id)
                    rank = 0
                    batch_sizes: list[int] = []
                    ks: list[int] = []
                    if where is not None:
                        rank = where[0]
                        # Without speculation a request decodes one token a step: its step count is known.
                        count = None if self.timeline_data.speculative else max(completion_tokens - 1, 0)
                        batch_sizes, ks = self.timeline_data.request_steps(
                            rank, where[1], first_token_latency=ttft or None, decode_steps=count
                        )
                    yield GenerationResult(
                        prompt_tokens=len(out.prompt_token_ids or []),
                        completion_tokens=completion_tokens,
                        finish_reason=completion.finish_reason or "stop",
                        spec_decode_metrics=spec.to_dict() if spec is not None else None,
                        first_scheduled=first_scheduled,
                        first_token=first_token,
                        finished=done,
                        queue_wait=(scheduled - queued) if scheduled and queued else None,
                        step_batch_sizes=batch_sizes,
                        step_k=ks,
                        engine_id=rank_engine_id(self.engine_id, rank, self.data_parallel_size),
                        dp_rank=rank,
                    )
        except EngineDeadError as exc:
            raise EngineDead(f"vLLM engine {self.engine_id}: {exc}") from exc

    def resolved_speculative_config(self) -> dict[str, Any] | None:
        if self._llm is None:
            return None
        spec = self._llm.vllm_config.speculative_config
        if spec is None:
            return None
        schedule = spec.num_speculative_tokens_per_batch_size
        return {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "num_speculative_tokens_per_batch_size": [list(e) for e in schedule] if schedule else None,
        }

    def requested_max_model_len(self) -> int | None:
        """What the arm asked vLLM for (its engine_kwargs win, as in engine_args), None: the model's own."""
        value = self.config.engine_kwargs.get("max_model_len", self.config.max_model_len)
        return None if value is None else int(value)

    def engine_facts(self) -> dict[str, Any]:
        """What the running engine's finalised config says beyond speculation: the vLLM version, CUDA-graph mode,
        model runner, executor, whether async scheduling is on and max_model_len (each can differ between arms and
        confound them with k: orchestrator/analysis/headline.py says where), the data-parallel size and each
        rank's engine id, and vLLM's own words when it dropped the schedule or lowered max_model_len."""
        config = self._llm.vllm_config if self._llm is not None else None
        final = int(config.model_config.max_model_len) if config is not None else None
        return {
            **resolved_engine_facts(config, self._target),
            **max_model_len_facts(final, self.requested_max_model_len(), self.max_model_len_warning),
            "data_parallel_size": self.data_parallel_size,
            "engine_ids": {str(r): e for r, e in self.rank_engine_ids().items()},
            "schedule_dropped_reason": self.schedule_dropped_reason,
            "telemetry_fallbacks": dict(self.timeline_data.fallbacks),
        }

    def timeline(self, since_step: int = 0) -> dict[str, list[Any]]:
        return self.timeline_data.since(since_step)

    def live(self) -> dict[str, float]:
        return self.timeline_data.last(0)

    def live_by_rank(self) -> dict[int, dict[str, float]]:
        return {r: self.timeline_data.last(r) for r in range(self.data_parallel_size)}

    def versions(self) -> dict[str, str]:
        import vllm

        return {"engine": f"vllm/{vllm.__version__}"}
