"""SGLang's speculation telemetry (read from SGLang 0.5.23's code; docs/engineering/other-engines.md cites it).

Per request: asked with `"return_spec_tokens_details": true` in the body, answered in a chunk of its own before the
usage chunk, `sglext.spec_tokens_details`: the request's verify steps (`spec_verify_ct`), accepted drafts
(`spec_num_correct_drafts`), `spec_num_proposed_drafts` (verify steps times the configured width less one, so
under adaptive steps it is not what was drafted) and `spec_accept_length`. Totals only: no step's draft length.
Counters: `sglang:spec_verify_calls_total` adds each finished request's verify steps, so it equals the trace's
summed verify steps exactly; `sglang:generation_tokens_total` its output tokens. Gauges (`sglang:spec_num_steps`,
`sglang:num_running_reqs`) are set when the scheduler logs its stats, every `decode_log_interval` (40) decode
batches: point samples.
"""

from __future__ import annotations

from serve_apps.engine_kinds.dialects.base import Dialect, RequestFormat

_DETAILS = "sglext.spec_tokens_details"

DIALECT = Dialect(
    name="sglang",
    request=RequestFormat(
        body={"return_spec_tokens_details": True},
        fields={
            "spec_steps": f"{_DETAILS}.spec_verify_ct",
            "accepted_tokens": f"{_DETAILS}.spec_num_correct_drafts",
            "drafted_tokens": f"{_DETAILS}.spec_num_proposed_drafts",
            "mean_acceptance_length": f"{_DETAILS}.spec_accept_length",
        },
    ),
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    counters={"num_drafts": "sglang:spec_verify_calls_total", "generation_tokens": "sglang:generation_tokens_total"},
    speculation="sglang:spec_",
    draft_length="sglang:spec_num_steps",
    reconciles=(("spec_steps", "num_drafts"), ("output_tokens", "generation_tokens")),
    steps="none",
    steps_note=(
        "SGLang reports each request's verify steps and accepted drafts as totals, never a step's draft length, "
        "and its running-requests gauge only every 40 decode batches"
    ),
    gauge_note=(
        "SGLang refreshes its draft-steps gauge every 40 decode batches: these are point samples, and a switch "
        "between two samples is not verifiable"
    ),
)
