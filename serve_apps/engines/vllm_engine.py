"""A real vLLM engine behind an arm: AsyncLLM with the arm's speculative config and per-request metrics.

What ran comes from vLLM itself: per-request `spec_decode_metrics` (per_request_spec_decode_metrics="detailed"),
the speculative config read back from the engine after vLLM finalised it, and a stat logger that sees every
engine step (running requests, drafts verified, accepted).
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from typing import Any

from serve_apps import clock
from serve_apps.arms import ArmSpec, VllmEngineConfig
from serve_apps.engines.base import GenerationInput, GenerationResult, TextDelta


class StepTimeline:
    """Per-step records appended by the stat logger (engine output thread), read by the server."""

    # k: drafts verified per drafting request in the step (what ran; 0 when nobody drafted, e.g. no n-gram match).
    # k_scheduled: the k vLLM's schedule lookup gives for the step's running requests (from the resolved config).
    COLUMNS = ("time", "batch_size", "waiting", "num_drafts", "drafted", "accepted", "k", "k_scheduled")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: dict[str, list[Any]] = {c: [] for c in self.COLUMNS}

    def append(self, **row: Any) -> None:
        with self._lock:
            for c in self.COLUMNS:
                self.rows[c].append(row[c])

    def since(self, index: int) -> dict[str, list[Any]]:
        with self._lock:
            return {c: list(v[index:]) for c, v in self.rows.items()}

    def window(self, start: float, end: float) -> tuple[list[int], list[int]]:
        with self._lock:
            times = self.rows["time"]
            picked = [i for i, t in enumerate(times) if start <= t <= end]
            return [self.rows["batch_size"][i] for i in picked], [self.rows["k"][i] for i in picked]

    def __len__(self) -> int:
        return len(self.rows["time"])


def _stat_logger_factory(timeline: StepTimeline, k_table: list[int]) -> Any:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class TimelineLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is None:
                return
            spec = scheduler_stats.spec_decoding_stats
            drafts = spec.num_drafts if spec is not None else 0
            drafted = spec.num_draft_tokens if spec is not None else 0
            timeline.append(
                time=clock.now(),
                batch_size=int(scheduler_stats.num_running_reqs),
                waiting=int(scheduler_stats.num_waiting_reqs),
                num_drafts=int(drafts),
                drafted=int(drafted),
                accepted=int(spec.num_accepted_tokens) if spec is not None else 0,
                # Drafts verified per drafting request this step: the k the engine ran (0 when nobody drafted).
                k=round(drafted / drafts) if drafts else 0,
                k_scheduled=k_table[min(max(int(scheduler_stats.num_running_reqs), 1), len(k_table) - 1)],
            )

        def log_engine_initialized(self) -> None:
            pass

    return TimelineLogger


class VllmEngine:
    kind = "vllm"

    def __init__(self, arm: ArmSpec, *, engine_id: str) -> None:
        assert isinstance(arm.engine, VllmEngineConfig)
        self.arm = arm
        self.config = arm.engine
        self.engine_id = engine_id
        self.timeline_data = StepTimeline()
        self._llm: Any = None

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        cfg = self.config
        speculative = self.arm.policy.to_vllm_speculative_config()
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "dtype": cfg.dtype,
            "enforce_eager": cfg.enforce_eager,
            "seed": cfg.seed,
            "speculative_config": speculative,
            "data_parallel_size": self.arm.topology.data_parallel_size,
            "tensor_parallel_size": self.arm.topology.tensor_parallel_size,
            "disable_log_stats": False,
        }
        if speculative is not None:  # vLLM refuses per-request spec metrics without speculation
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        if cfg.served_model_name:
            kwargs["served_model_name"] = cfg.served_model_name
        if cfg.max_model_len is not None:
            kwargs["max_model_len"] = cfg.max_model_len
        if cfg.max_num_seqs is not None:
            kwargs["max_num_seqs"] = cfg.max_num_seqs
        kwargs.update(cfg.engine_kwargs)
        return AsyncEngineArgs(**kwargs)

    async def start(self) -> None:
        if self._llm is not None:
            return
        # No forced offline mode: a fresh cluster downloads (or finds in HF_HOME) its models; tests set it in env.
        from serve_apps.engines.vllm_support import require_tested_vllm
        require_tested_vllm(os.environ)
        from vllm.v1.engine.async_llm import AsyncLLM

        args = self.engine_args()
        # What vLLM will run: the config it finalises (the DP fallback applies here), not what the arm asked for.
        finalised = args.create_engine_config()
        spec = finalised.speculative_config
        max_seqs = finalised.scheduler_config.max_num_seqs
        if spec is None:
            k_table = [0] * (max_seqs + 1)
        elif spec.num_speculative_tokens_per_batch_size:
            from serve_apps.policies import dense_schedule, validate_schedule

            schedule = validate_schedule([list(e) for e in spec.num_speculative_tokens_per_batch_size])
            k_table = dense_schedule(schedule, max_seqs, spec.num_speculative_tokens)
        else:
            k_table = [0] + [spec.num_speculative_tokens] * max_seqs
        self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(self.timeline_data, k_table)])

    async def stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

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
        async for out in self._llm.generate(prompt, params, request.request_id):
            completion = out.outputs[0]
            n = len(completion.token_ids)
            if n:
                now = clock.now()
                first_token = first_token if first_token is not None else now
                completion_tokens += n
                yield TextDelta(text=completion.text, tokens=n, time=now, prompt_tokens=len(out.prompt_token_ids or []))
            if out.finished:
                done = clock.now()
                stats = out.metrics
                queued = getattr(stats, "queued_ts", 0.0) if stats is not None else 0.0
                scheduled = getattr(stats, "scheduled_ts", 0.0) if stats is not None else 0.0
                first_scheduled = clock.from_monotonic(scheduled) if scheduled else None
                spec = completion.spec_decode_metrics
                batch_sizes, ks = self.timeline_data.window(first_scheduled or done, done)
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
                    engine_id=self.engine_id,
                )

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

    def timeline(self, since_step: int = 0) -> dict[str, list[float] | list[int]]:
        return self.timeline_data.since(since_step)

    def live(self) -> dict[str, float]:
        rows = self.timeline_data.since(max(0, len(self.timeline_data) - 1))
        if not rows["time"]:
            return {"running": 0.0, "waiting": 0.0, "k": 0.0}
        return {
            "running": float(rows["batch_size"][-1]),
            "waiting": float(rows["waiting"][-1]),
            "k": float(rows["k"][-1]),
        }

    def versions(self) -> dict[str, str]:
        import vllm

        return {"engine": f"vllm/{vllm.__version__}"}
