"""TensorRT-LLM's speculation telemetry (`trtllm-serve`, read from its main branch's code; docs/engineering/
other-engines.md cites it).

Per request: nothing about speculation over HTTP. `X-TRTLLM-return-metrics: 1` returns timings only (headers, or
a `trtllm.perf_metrics` event after `[DONE]` when streaming); the per-request speculative totals go to the
server's own JSONL file. Prometheus text is at /prometheus/metrics (the /metrics route is the iteration-stats
JSON, drained on read, so it is never read here: reading it would take it from the operator's own monitoring).
Counters: draft and accepted tokens (from the iteration stats), generation tokens (per finished request, so it
reconciles with the trace). No metric reports the draft length a step ran with: the schedule is not verifiable.
"""

from __future__ import annotations

from serve_apps.engine_kinds.dialects.base import Dialect, RequestFormat

DIALECT = Dialect(
    name="trtllm",
    request=RequestFormat(),
    running="trtllm_num_requests_running",
    waiting="trtllm_num_requests_waiting",
    counters={
        "draft_tokens": "trtllm_spec_decode_num_draft_tokens_total",
        "accepted_tokens": "trtllm_spec_decode_num_accepted_tokens_total",
        "generation_tokens": "trtllm_generation_tokens_total",
    },
    speculation="trtllm_spec",
    metrics_path="/prometheus/metrics",
    reconciles=(("output_tokens", "generation_tokens"),),
    steps="none",
    steps_note=(
        "TensorRT-LLM reports no draft length per step, per request or per iteration (only draft and accepted "
        "token totals), so which draft length ran at which batch size cannot be shown"
    ),
)
