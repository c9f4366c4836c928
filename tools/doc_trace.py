"""docs/reference/trace-schema.md, generated from loadshapes/trace.py (the trace files' columns and the comments beside
them) and orchestrator/rundir/layout.py (the step timeline files' columns)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from tools.doc_source import cell, sentence, source

TRACE_NOTES: dict[str, str] = {
    "campaign": "the campaign's name",
    "run": "the run's id (one `specdrill run` / `simulate` of the campaign into an output)",
    "arm": "partition column (in the path): `<policy>-<topology>`, the names in the campaign",
    "shape": "partition column (in the path): the shape's name in the campaign",
    "phase": "the shape's phase at the scheduled time (e.g. `rise_past_bs12`)",
    "worker": "the load worker that sent it",
    "request_id": "`{arm}:{shape}:{repeat}:{i}`, sent as `x-request-id`",
    "category": "the mix category (chat, editing, reasoning, ...)",
    "prompt_sha256": "a hash of the prompt, not the prompt: the SHA-256 of its UTF-8 text as 64 hex digits, on every "
    "row whose request was planned (null otherwise); the same request has the same hash on every arm",
    "prompt": "the prompt text (only with `store_prompts: true`)",
    "first_token_ns": "first content token arrived",
    "token_times_ns": "every token's arrival time (`load.store_token_times`)",
    "step_batch_size": "per step of the request: batch size",
    "step_k": "per step: executed k (0 included)",
    "per_step_drafted": "per drafting step: tokens drafted (vLLM's name)",
    "per_step_accepted": "per drafting step: tokens accepted (vLLM's name)",
    "schedule_dropped": "the engine dropped the dynamic schedule (data parallelism; vLLM 0.33's model runner V1)",
    "error_class": "`http_<code>`, `truncated_stream`, `invalid_json`, `missing_usage`, `timeout`, ...",
    "policy": "the arm's policy label, e.g. `fixed-eagle-k3`, `dynamic-eagle-k3[1-4=3,5-12=1,13-512=0]`",
    "topology": "the arm's topology label, e.g. `single`, `data_parallel2`",
    "repeat": "the unit's repeat",
    "request_index": "i: the request's place in the unit's plan, the same on every arm",
    "scheduled_ns": "when the plan says to send it; latencies count from here",
    "prompt_tokens": "from the server's usage",
    "output_tokens": "from the server's usage",
    "ttft_s": "first token minus scheduled",
    "e2e_s": "done minus scheduled",
    "tpot_s": "(last token - first token) / (tokens - 1), from the client's token times",
    "itl_p50_s": "inter-token gap, median",
    "itl_p99_s": "inter-token gap, p99",
    "itl_max_s": "inter-token gap, largest",
    "queue_wait_s": "time the request waited in the engine before its first step",
    "server_received_ns": "server timestamps, on specdrill's clock (specdrill arms only)",
    "engine_steps": "engine steps the request was in",
    "step_batch_mean": "mean batch size over those steps (the batch-size bands)",
    "step_batch_max": "largest batch size over those steps",
    "step_k_sum": "sum of executed k over those steps",
    "drafted_tokens": "draft tokens verified",
    "accepted_tokens": "draft tokens accepted",
    "mean_acceptance_length": "vLLM's per-request metric",
    "replica_id": "the Serve replica that answered",
    "engine_id": "the engine (`<arm>/<replica>/dp<rank>` under data parallelism)",
    "node_id": "the Ray node",
    "error_message": "one line",
}

# The step timeline files' columns (orchestrator/rundir/layout.py timeline_table): meaning, unit, and when null.
TIMELINE_NOTES: dict[str, str] = {
    "engine_id": "the engine that ran the step; each rank of a vLLM data-parallel group is its own engine "
    "(`engine_id` as in the traces); never null",
    "start_ns": "the step's start, epoch nanoseconds on specdrill's clock (virtual time: from the fixed virtual "
    "epoch); vLLM: the front end's record time minus the engine core's own timing of the step; never null",
    "end_ns": "the step's end, epoch nanoseconds; vLLM: when the front end recorded it (after the IPC hop, so "
    "both ends are late by that lag, the duration is the engine's); never null",
    "dp_rank": "the engine's rank in its vLLM data-parallel group (vLLM, and the simulated engine in virtual time); "
    "0 for a single engine and for each replica, and in real time for the simulated engine, whose ranks are each a "
    "Serve replica of their own (told apart by engine_id); never null",
    "batch_size": "requests scheduled in the step (vLLM's key for the schedule lookup)",
    "num_prefill": "requests in the step that were prefilling",
    "k": "executed draft length (tokens drafted per drafting request, 0 for plain decoding); null where the engine "
    "could not observe it (vLLM: no request carried the step's drafts on to the next step)",
    "k_scheduled": "the k vLLM's schedule lookup gives for batch_size under the engine's resolved config; null for "
    "the simulated engine (its k is the schedule's by construction)",
    "drafted": "draft tokens verified in the step (proposed by the previous one)",
    "accepted": "draft tokens accepted in the step",
    "num_drafts": "requests whose drafts were verified in the step (vLLM); null for the simulated engine",
    "waiting": "requests waiting in the engine's queue at the step",
    "batched_tokens": "tokens computed in the step: prefill chunks, 1 + drafts per decoding request; null in "
    "timelines written before it existed and for vLLM without iteration details",
    "kv_tokens": "KV-cache tokens the step read (vLLM: blocks in use x block size, so up to block_size - 1 per "
    "request above the contexts); null in older timelines, before vLLM reported its block count, and in a vLLM "
    "step where a request finished (its usage is sampled after the blocks were freed)",
    "drafts_skipped": "vLLM proposed no drafts after the step because no request scheduled in it could use them "
    "(vLLM's skip_drafts, 0.33 and 0.34 on model runner V2 with a drafter that has its own forward pass: eagle, "
    "eagle3, mtp, draft_model, dflash); k = 0 there is vLLM's design, and the executed-policy check counts these "
    "steps apart, never as a mismatch. No stat of vLLM carries the scheduler's flag, so specdrill recomputes its "
    "condition from the step: every scheduled request was on a non-final prefill chunk or finished in the step for "
    "length (see docs/operator/verification.md). Present only where an engine could skip drafts; absent (read as "
    "false) for "
    "vLLM 0.32, model runner V1, the n-gram and suffix methods, the simulated engine and older timelines",
    "lag_s": "wall seconds the real-time simulated engine handed the step's tokens out after the model's step end "
    "(its latencies are the host's where this grows); present only where some engine reported it (null for the "
    "others), absent for vLLM and virtual time",
}


def trace_schema() -> str:
    from loadshapes import trace

    path = Path(inspect.getfile(trace))
    src = source(path.read_text())
    fields = next(
        node.value
        for node in src.tree.body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_FIELDS" for t in targets(node))
    )
    assert isinstance(fields, ast.List)
    out = [
        "# Trace schema",
        "",
        "<!-- generated by `python -m tools.docgen` (make docs) from loadshapes/trace.py, the schema's one",
        "     home; edit its comments, not this page. tests/test_docs.py fails when it is stale. -->",
        "",
        f"Schema version **{trace.SCHEMA_VERSION}**, in every file's Parquet metadata under "
        f"`{trace.VERSION_KEY.decode()}`. `read_traces` refuses another version in one line (rerun the campaign "
        "into a new output).",
        "",
        inspect.cleandoc(trace.__doc__ or ""),
        "",
        f"`{'`, `'.join(trace.PARTITION_COLUMNS)}` live in the path (Hive partitions), not in the files. "
        f"`{'`, `'.join(trace.STEP_LIST_COLUMNS)}` are filled only with `load.store_step_lists: true` and always "
        "for endpoint arms (which have no step timeline); the per-request step summaries are always written. ",
        "",
        "```sql",
        "SELECT arm, shape, count(*), quantile_cont(tpot_s, 0.5)",
        "FROM read_parquet('runs/quickstart/traces/**/*.parquet', hive_partitioning = true) GROUP BY ALL;",
        "```",
        "",
    ]
    header = ["| column | type | null | meaning |", "|---|---|---|---|"]
    previous_end = fields.lineno
    table_open = False
    for element in fields.elts:
        if not (isinstance(element, ast.Call) and element.args and isinstance(element.args[0], ast.Constant)):
            raise RuntimeError(f"{path}:{element.lineno}: _FIELDS holds something other than pa.field('name', ...)")
        name = str(element.args[0].value)
        group = [src.comments[n] for n in range(previous_end + 1, element.lineno) if n in src.comments]
        if group or not table_open:
            if group:
                out += ([""] if table_open else []) + [sentence(group), ""]
            out += header
            table_open = True
        column = trace.TRACE_SCHEMA.field(name)
        end = element.end_lineno or element.lineno
        meaning = sentence(src.trailing(element.lineno, end)) or TRACE_NOTES.get(name, "")
        nullable = "yes" if column.nullable else "no"
        out.append(f"| `{name}` | `{column.type}` | {nullable} | {cell(meaning)} |")
        previous_end = end
    out.append("")
    return "\n".join(out + timeline_schema())


def timeline_columns() -> list[tuple[str, str]]:
    """(name, Arrow type) of a step timeline file's columns, as unit_files.timeline_table writes them."""
    from orchestrator.rundir.unit_files import timeline_table

    schema = timeline_table(
        {"engine": {"start": [0.0], "end": [0.0], "lag_s": [0.0], "drafts_skipped": [False]}}
    ).schema
    return [(f.name, str(f.type)) for f in schema]


def timeline_schema() -> list[str]:
    out = [
        "## Step timelines",
        "",
        "One file per unit, `timelines/arm=<arm>/shape=<shape>/r<repeat>.parquet` (arm, shape and repeat live in the "
        "path), written when the unit ends: one row per engine step of every engine of the arm, "
        "in the "
        "order the engines reported them (the ranks of a data-parallel group interleave). The executed-policy check, "
        "the cross-and-recover switch timings, `specdrill calibrate` and report.html's engine timelines read them. "
        "Times are `int64` nanoseconds, the other integers `int32`.",
        "",
        "| column | type | meaning |",
        "|---|---|---|",
    ]
    for name, kind in timeline_columns():
        out.append(f"| `{name}` | `{kind}` | {cell(TIMELINE_NOTES[name])} |")
    out.append("")
    return out


def targets(node: ast.AnnAssign | ast.Assign) -> list[ast.expr]:
    return [node.target] if isinstance(node, ast.AnnAssign) else list(node.targets)
