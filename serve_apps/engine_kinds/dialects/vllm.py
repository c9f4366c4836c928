"""vLLM's speculation telemetry (`vllm serve`, Ray Serve LLM, and specdrill's own servers, which answer in it).

Per request: `metrics.speculative_decoding` of the final chunk, with `--per-request-spec-decode-metrics detailed`
(the server's flag, nothing in the request): the drafted and accepted tokens of every step the request was in.
Counters on /metrics: drafts (one per request per drafting step), draft tokens, accepted tokens; all three
reconcile with the trace exactly. The running gauge gives each step's batch only approximately (sampled).
"""

from __future__ import annotations

from serve_apps.engine_kinds.dialects.base import Dialect, RequestFormat

DIALECT = Dialect(
    name="vllm",
    request=RequestFormat(
        fields={
            "per_step_drafted": "metrics.speculative_decoding.per_step_drafted",
            "per_step_accepted": "metrics.speculative_decoding.per_step_accepted",
            "mean_acceptance_length": "metrics.speculative_decoding.mean_acceptance_length",
        }
    ),
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    counters={
        "num_drafts": "vllm:spec_decode_num_drafts_total",
        "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    },
    speculation="spec_decode",
    reconciles=(
        ("spec_steps", "num_drafts"),
        ("drafted_tokens", "draft_tokens"),
        ("accepted_tokens", "accepted_tokens"),
    ),
    steps="per_step",
)
