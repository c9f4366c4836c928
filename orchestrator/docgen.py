"""Generates the reference pages that must not drift from the code: docs/campaign-reference.md from the campaign
file's pydantic models, docs/trace-schema.md from loadshapes/trace.py. `python -m orchestrator.docgen` (make docs)
rewrites them; `--check` only says which are stale. tests/test_docs.py fails when a checked-in page differs.

Descriptions come from the source itself: a field's `description=`, else the comment block right above it and
the comment at the end of its line, read with ast + tokenize so they stay where the code's readers see them.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import sys
import textwrap
import tokenize
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parent.parent
CAMPAIGN_PAGE = "docs/campaign-reference.md"
TRACE_PAGE = "docs/trace-schema.md"

# Tool directives, not prose.
_DIRECTIVES = ("fmt:", "noqa", "type:", "pragma:")

# For fields and columns whose source has no comment: what a reader needs. A source comment, once written, wins;
# tests/test_docs.py checks every key here still names a real field or column.
FIELD_NOTES: dict[str, str] = {
    "Campaign.name": "slug; arms are served at `/<name>/<arm>` and named `<policy>-<topology>`",
    "Campaign.engine": "what serves the arms: the simulated engine, vLLM, or servers someone else runs (endpoint)",
    "Campaign.policies": (
        'name -> policy: the short form (`"off"`, `"fixed:3"`, `"fixed:ngram:4"`, `"dynamic:3:1-64=3,65-128=1"`; '
        "method and drafter default to the simulated profile's, n-gram otherwise) or a mapping in vLLM's terms "
        '(OffPolicy, FixedPolicy, DynamicPolicy); quote `"off"`: YAML reads off as false'
    ),
    "Campaign.topologies": "name -> `single`, `replicas:N`, `data_parallel:N`, or a Topology mapping",
    "Campaign.shapes": "name -> load shape; every arm runs every shape `repeats` times with the same traffic",
    "Campaign.repeats": "runs of every shape on every arm (each repeat its own seeded traffic)",
    "Campaign.seed": "seeds all traffic: arrival times and requests depend on it, the shape and the repeat only",
    "Campaign.slo": "deadlines that make a request count toward goodput",
    "Campaign.resources": "what each engine reserves in the Ray cluster",
    "Campaign.serve": "where Ray Serve listens for the arms",
    "Campaign.mix": "the requests: weighted workloads or a JSONL dataset",
    "Campaign.warmup": "unmeasured requests to each arm after it is deployed",
    "Campaign.load": "the load workers",
    "Campaign.gates": "what makes the run and the report exit non-zero (exit code 3)",
    "_Speculative.method": "vLLM's speculative method",
    "_Speculative.model": "the drafter (required by methods with a drafter network; none for n-gram and suffix)",
    "_Speculative.prompt_lookup_max": "n-gram: longest n-gram to match in the prompt (vLLM's name)",
    "_Speculative.prompt_lookup_min": "n-gram: shortest n-gram to match (vLLM's name)",
    "FixedPolicy.k": "vLLM's `num_speculative_tokens`: tokens drafted every step",
    "DynamicPolicy.max_k": "vLLM's `num_speculative_tokens`; under data parallelism vLLM runs this k in every step",
    "DynamicPolicy.schedule": (
        "vLLM's `num_speculative_tokens_per_batch_size`: `[start, end, k]` by batch size, sorted, not overlapping, "
        "the first starting at 1; gaps and the tail keep the previous k"
    ),
    "SimulatedEngineConfig.profile": "a shipped profile's name (serve_apps/profiles/) or the path of your own YAML",
    "SimulatedEngineConfig.time_scale": (
        "> 1 slows the simulated hardware uniformly, in real and virtual time alike, so a small host keeps up in "
        "real time (docs/simulator.md)"
    ),
    "SimulatedEngineConfig.seed": "seeds the engine's acceptance draws (each engine of an arm gets its own offset)",
    "SimulatedEngineConfig.max_model_len": "a request whose prompt + max_tokens exceeds it is refused",
    "VllmEngineConfig.model": "the target model (Hugging Face id or local path)",
    "VllmEngineConfig.served_model_name": "the name the arm answers to in `model`; default: `model`",
    "VllmEngineConfig.max_num_seqs": "vLLM's; also the last batch size the schedule tables cover (default 512)",
    "EndpointEngineConfig.model": "the model name sent in every request",
    "EndpointEngineConfig.api_key_env": "environment variable holding the API key (sent as a bearer token)",
    "EndpointEngineConfig.max_num_seqs": "the servers' max_num_seqs: the last batch size the schedule tables cover",
    "Topology.kind": "`data_parallel` is one vLLM DP group (vLLM drops a dynamic schedule there: static max k)",
    "Topology.size": "engines (`replicas`) or data-parallel ranks (`data_parallel`)",
    "Topology.tensor_parallel_size": "passed to vLLM",
    "Resources.cpus_per_engine": "CPUs each engine's replica reserves",
    "Resources.placement_strategy": "Ray placement strategy for engines that span nodes (a placement group)",
    "ServeConfig.host": "Ray Serve's HTTP host; loopback unless you open it (docs/security.md)",
    "ServeConfig.port": "Ray Serve's HTTP port; a campaign asking for another port than Serve's running one is refused",
    "ArmSelection.policy": "a name under `policies`",
    "ArmSelection.topology": "a name under `topologies`",
    "ShapeBase.open_loop": "false only for `concurrency` (closed loop); not meant to be set",
    "Quiet.rate": "requests per second",
    "Sustained.rate": "requests per second",
    "Ramp.rate_from": "requests per second at the start, rising (or falling) linearly to `rate_to`",
    "Step.rates": "requests per second of each step, `step_s` seconds each",
    "CrossAndRecover.quiet_rate": "requests per second before and after",
    "CrossAndRecover.boundary_rate": "the rate that crosses the boundary (quiet_rate < boundary_rate < peak_rate)",
    "CrossAndRecover.boundary": "names the phases (`rise_past_<boundary>`, `above_<boundary>`, ...)",
    "Concurrency.users": "closed-loop users, each sending its next request when the previous one ends",
    "Replay.shape": "specdrill only: with `arm`, the partition to replay",
    "Replay.start_s": "window start, in the trace's seconds from its first request",
    "Replay.duration_s": "window length; default: to just after the last arrival",
    "Replay.speed": "offsets are divided by this (2 replays twice as fast)",
    "Replay.rate_scale": "thin (< 1) or replicate (> 1) requests, seeded, keeping the bursts",
    "Replay.target_rate": "the same, to this mean rate (requests per second); give one of the two",
    "Replay.failed_category": "category of failed requests kept with `failed: expect_error`",
    "Replay.bin_s": "phase length: phases are `replay00`, `replay01`, ... bins of this many seconds",
    "RequestMix.entries": "weighted workloads",
    "RequestMix.dataset": "JSONL, a request per line (`category`, `prompt`, `max_tokens`, ...); not with `entries`",
    "SloConfig.ttft_s": "time to first token, from the scheduled time",
    "SloConfig.tpot_s": "time per output token after the first",
    "SloConfig.e2e_s": "end to end, from the scheduled time",
    "LoadConfig.workers": "load workers (Ray actors, spread over the nodes); the traffic is the same for any number",
    "LoadConfig.cpus_per_worker": "CPUs each worker actor reserves",
    "LoadConfig.process": "arrivals: inhomogeneous Poisson, gamma (burstiness `cv`) or even gaps, at the shape's rate",
    "LoadConfig.endpoint": "`/v1/completions` or `/v1/chat/completions`, streamed",
    "LoadConfig.lateness_bound_s": "a worker whose p99 send lateness exceeds this makes its unit generator-saturated",
    "LoadConfig.drain_s": "after the last send, requests still in flight this long are cancelled (`drain_timeout`)",
    "LoadConfig.request_timeout_s": "a request running longer becomes a `timeout` row",
    "LoadConfig.max_in_flight": "connections per worker; a request that finds none free waits and saturates the unit",
    "LoadConfig.store_token_times": "keep every token's arrival time (`token_times_ns`)",
    "LoadConfig.flush_s": "see flush_rows",
    "LoadConfig.ready_timeout_s": "how long a worker may take to build its schedule and request bodies",
    "GateConfig.min_follow_fraction": "share of steps whose executed k must equal the configured k",
    "GateConfig.fail_on_schedule_dropped": "an arm whose engine dropped its schedule fails (exempt arms excepted)",
    "GateConfig.fail_on_saturated_generator": "a load-generator-saturated unit fails",
    "CategoryRule.by": "what to match: the file's name, BurstGPT's `Model`, or its `Log Type`",
    "CategoryRule.map": "key -> category",
    "CategoryRule.default": "category for values no key matches; none: the mix draws one",
    "MixEntry.workload": "a built-in workload's name (see Workload) or an inline Workload",
    "MixEntry.weight": "relative share of requests",
    "Workload.category": "the acceptance profile the simulated engine uses (chat, editing, reasoning, ...)",
    "Workload.prompt_tokens": "prompt length distribution",
    "Workload.output_tokens": "where the model stops (EOS)",
    "Workload.max_tokens": "sent as `max_tokens`",
    "Workload.ignore_eos": "sent as `ignore_eos`: run to max_tokens",
    "VllmEngineConfig.dtype": "vLLM's `dtype`",
    "VllmEngineConfig.max_model_len": "vLLM's; default: the model's",
    "VllmEngineConfig.enforce_eager": "vLLM's: no CUDA graphs",
    "VllmEngineConfig.seed": "vLLM's `seed`",
    "VllmEngineConfig.engine_kwargs": "any other AsyncEngineArgs field (not those the arm's policy and layout set)",
    "Ramp.rate_to": "requests per second at the end",
    "Step.step_s": "seconds per step",
    "CrossAndRecover.peak_rate": "requests per second held above the boundary",
    "CrossAndRecover.quiet_s": "seconds of quiet before the rise and after the fall",
    "CrossAndRecover.rise_s": "seconds rising from quiet_rate to peak_rate",
    "CrossAndRecover.hold_s": "seconds at peak_rate",
    "CrossAndRecover.fall_s": "seconds falling back to quiet_rate",
    "Day.min_rate": "requests per second at the trough",
    "Day.max_rate": "requests per second at the peak",
    "Day.segments": "linear pieces the curve is drawn with (phases `hour00` ...)",
    "Replay.max_output_tokens": "clip recorded output lengths",
    "Deadlines.ttft_s": "replaces `slo.ttft_s` for this category",
    "Deadlines.tpot_s": "replaces `slo.tpot_s` for this category",
    "Deadlines.e2e_s": "replaces `slo.e2e_s` for this category",
    "Workload.name": "the workload's name in reports",
    "Fixed.value": "tokens",
    "Uniform.low": "tokens",
    "Uniform.high": "tokens",
}
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
    "schedule_dropped": "the engine dropped the dynamic schedule (vLLM's data-parallel fallback)",
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

# The step timeline files' columns (orchestrator/rundir.py timeline_table): meaning, unit, and when null.
TIMELINE_NOTES: dict[str, str] = {
    "engine_id": "the engine that ran the step; each rank of a vLLM data-parallel group is its own engine "
    "(`engine_id` as in the traces); never null",
    "start_ns": "the step's start, epoch nanoseconds on specdrill's clock (virtual time: from the fixed virtual "
    "epoch); vLLM: the front end's record time minus the engine core's own timing of the step; never null",
    "end_ns": "the step's end, epoch nanoseconds; vLLM: when the front end recorded it (after the IPC hop, so "
    "both ends are late by that lag, the duration is the engine's); never null",
    "dp_rank": "the engine's rank in its vLLM data-parallel group; 0 for a single engine and for each replica; "
    "never null",
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
    "lag_s": "wall seconds the real-time simulated engine handed the step's tokens out after the model's step end "
    "(its latencies are the host's where this grows); present only where some engine reported it (null for the "
    "others), absent for vLLM and virtual time",
}


# --- comments from source ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    lines: list[str]  # the code, 1-based through lines[n - 1]
    comments: dict[int, str]  # line -> comment text without '#'
    tree: ast.Module

    def above(self, line: int) -> list[str]:
        """The comment lines right above `line` (a block with no code or blank line in between)."""
        out: list[str] = []
        at = line - 1
        while at >= 1 and self.lines[at - 1].lstrip().startswith("#"):
            out.insert(0, self.comments.get(at, ""))
            at -= 1
        return [c for c in out if c]

    def trailing(self, first: int, last: int) -> list[str]:
        return [
            self.comments[n]
            for n in range(first, last + 1)
            if n in self.comments and not self.lines[n - 1].lstrip().startswith("#")
        ]


def _source(text: str) -> _Source:
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comment = token.string.lstrip("#").strip()
            if not comment.startswith(_DIRECTIVES):
                comments[token.start[0]] = comment
    return _Source(lines=text.splitlines(), comments=comments, tree=ast.parse(text))


@cache
def _class_source(cls: type) -> _Source:
    return _source(textwrap.dedent(inspect.getsource(cls)))


def _sentence(parts: Sequence[str]) -> str:
    return " ".join(" ".join(parts).split())


def _field_comment(model: type[BaseModel], name: str) -> str:
    """The comments of the class in the MRO that declares `name`."""
    for cls in model.__mro__:
        if name not in inspect.get_annotations(cls):
            continue
        src = _class_source(cls)
        body = src.tree.body[0]
        assert isinstance(body, ast.ClassDef)
        for node in body.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                end = node.end_lineno or node.lineno
                return _sentence(src.above(node.lineno) + src.trailing(node.lineno, end))
        return ""
    return ""


# --- the campaign reference ----------------------------------------------------------------------------------------


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in get_args(annotation):
        if not isinstance(arg, FieldInfo):
            yield from _models_in(arg)


def _type(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type(args[0])
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"map {_type(args[0])} -> {_type(args[1])}"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_type(args[0])}"
        return "[" + ", ".join(_type(a) for a in args) + "]"
    return str(annotation)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _plain(value.model_dump(mode="json", by_alias=True))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "its defaults"
    return f"`{json.dumps(_plain(value), separators=(', ', ': '))}`"


def _constraints(field: FieldInfo) -> str:
    out = []
    for meta in field.metadata:
        for attr, text in (("gt", "> {}"), ("ge", ">= {}"), ("lt", "< {}"), ("le", "<= {}")):
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(text.format(value))
        if getattr(meta, "min_length", None) is not None:
            out.append(f"at least {meta.min_length}")
        if getattr(meta, "max_length", None) is not None:
            out.append(f"at most {meta.max_length}")
        if getattr(meta, "pattern", None):
            out.append(f"matches `{meta.pattern}`")
        if getattr(meta, "allow_inf_nan", None) is False:
            out.append("finite")
    return ", ".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _doc(cls: type) -> str:
    own = cls.__dict__.get("__doc__")
    return inspect.cleandoc(own) if own else ""


# The models Campaign reaches, in the order a reader meets their keys. `policies` is typed Any (a short form or a
# mapping), so its models are named here.
def campaign_models() -> list[tuple[type[BaseModel], list[str]]]:
    from orchestrator.campaign import Campaign
    from serve_apps.policies import DynamicPolicy, FixedPolicy, OffPolicy

    extra: dict[tuple[type[BaseModel], str], list[type[BaseModel]]] = {
        (Campaign, "policies"): [OffPolicy, FixedPolicy, DynamicPolicy]
    }
    seen: dict[type[BaseModel], list[str]] = {}

    def visit(model: type[BaseModel], path: str) -> None:
        if model in seen:
            seen[model].append(path)
            return
        seen[model] = [path] if path else []
        for name, field in model.model_fields.items():
            key = field.alias or name
            origin = get_origin(field.annotation)
            suffix = ".<name>" if origin is dict else "[]" if origin in (list, tuple) else ""
            child = f"{path}.{key}{suffix}".lstrip(".")
            for found in [*_models_in(field.annotation), *extra.get((model, name), [])]:
                visit(found, child)

    visit(Campaign, "")
    names = [m.__name__ for m in seen]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise RuntimeError(f"two campaign models named {clash[0]}: anchors would collide")
    return list(seen.items())


def _note(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    if field.description:
        return field.description
    comment = _field_comment(model, name)
    if comment:
        return comment
    note = next((FIELD_NOTES[k] for c in model.__mro__ if (k := f"{c.__name__}.{name}") in FIELD_NOTES), "")
    if note or (name != "kind" and not name.endswith("_s")):
        return note
    return "selects this mapping" if name == "kind" else "seconds"


def _fields(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    # `kind` first: it says which of several mappings this is.
    return sorted(model.model_fields.items(), key=lambda item: item[0] != "kind")


def _extra_text(model: type[BaseModel]) -> list[str]:
    from loadshapes.mixes import BUILTIN_WORKLOADS, Workload

    if model is Workload:
        names = ", ".join(f"`{n}` ({w.category})" for n, w in BUILTIN_WORKLOADS.items())
        return [f"Built in, by name (`workload: chat`): {names}.", ""]
    return []


def campaign_reference() -> str:
    out = [
        "# Campaign file reference",
        "",
        "<!-- generated by `python -m orchestrator.docgen` (make docs) from orchestrator/campaign.py and the models it",
        "     references; edit the code's comments, not this page. tests/test_docs.py fails when it is stale. -->",
        "",
        "A campaign is one YAML file (`specdrill run|simulate|deploy CAMPAIGN.yaml`). Every mapping is strict: an",
        "unknown key, a bad value or a bad reference is refused in one line naming its path",
        "(`campaign c.yaml: shapes.q.quiet.burst: Extra inputs are not permitted`), exit code 2, nothing deployed.",
        "Where a key takes one of several mappings, `kind` says which. Shipped examples:",
        "`campaigns/quickstart.yaml`, `campaigns/gpu-llama3.1-8b-eagle.yaml`,",
        "`campaigns/replay-burstgpt-example.yaml`, `examples/sim-campaign.yaml`.",
        "",
    ]
    models = campaign_models()
    out += ["Sections: " + ", ".join(f"[{m.__name__}](#{m.__name__.lower()})" for m, _ in models) + ".", ""]
    for model, path in models:
        out += [f"## {model.__name__}", ""]
        if path:
            out += ["At " + ", ".join(f"`{p}`" for p in dict.fromkeys(path)) + ".", ""]
        doc = _doc(model)
        if doc:
            out += [doc, ""]
        out += _extra_text(model)
        if not model.model_fields:
            out += ["No keys besides `kind`.", ""]
            continue
        out += ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
        for name, field in _fields(model):
            row = [
                f"`{field.alias or name}`",
                _type(field.annotation),
                _default(field),
                _constraints(field),
                _cell(_note(model, name, field)),
            ]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


# --- the trace schema ------------------------------------------------------------------------------------------


def trace_schema() -> str:
    from loadshapes import trace

    path = Path(inspect.getfile(trace))
    src = _source(path.read_text())
    fields = next(
        node.value
        for node in src.tree.body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_FIELDS" for t in _targets(node))
    )
    assert isinstance(fields, ast.List)
    out = [
        "# Trace schema",
        "",
        "<!-- generated by `python -m orchestrator.docgen` (make docs) from loadshapes/trace.py, the schema's one",
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
                out += ([""] if table_open else []) + [_sentence(group), ""]
            out += header
            table_open = True
        column = trace.TRACE_SCHEMA.field(name)
        end = element.end_lineno or element.lineno
        meaning = _sentence(src.trailing(element.lineno, end)) or TRACE_NOTES.get(name, "")
        nullable = "yes" if column.nullable else "no"
        out.append(f"| `{name}` | `{column.type}` | {nullable} | {_cell(meaning)} |")
        previous_end = end
    out.append("")
    return "\n".join(out + timeline_schema())


def timeline_columns() -> list[tuple[str, str]]:
    """(name, Arrow type) of a step timeline file's columns, as rundir.timeline_table writes them."""
    from orchestrator.rundir import timeline_table

    schema = timeline_table({"engine": {"start": [0.0], "end": [0.0], "lag_s": [0.0]}}).schema
    return [(f.name, str(f.type)) for f in schema]


def timeline_schema() -> list[str]:
    out = [
        "## Step timelines",
        "",
        "One file per unit, `timelines/arm=<arm>/shape=<shape>/r<repeat>.parquet` (arm, shape and repeat live in the "
        "path), written by orchestrator/rundir.py: one row per engine step of every engine of the arm, in the order "
        "the engines reported them (the ranks of a data-parallel group interleave). The executed-policy check, "
        "the cross-and-recover switch timings, `specdrill calibrate` and report.html's engine timelines read them. "
        "Times are `int64` nanoseconds, the other integers `int32`.",
        "",
        "| column | type | meaning |",
        "|---|---|---|",
    ]
    for name, kind in timeline_columns():
        out.append(f"| `{name}` | `{kind}` | {_cell(TIMELINE_NOTES[name])} |")
    out.append("")
    return out


def _targets(node: ast.AnnAssign | ast.Assign) -> list[ast.expr]:
    return [node.target] if isinstance(node, ast.AnnAssign) else list(node.targets)


PAGES: dict[str, Callable[[], str]] = {CAMPAIGN_PAGE: campaign_reference, TRACE_PAGE: trace_schema}


def stale(root: Path = REPO) -> list[str]:
    return [page for page, render in PAGES.items() if _read(root / page) != render()]


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--check"]:
        pages = stale()
        for page in pages:
            print(f"{page} is stale: run make docs")
        return 1 if pages else 0
    if args:
        print("usage: python -m orchestrator.docgen [--check]", file=sys.stderr)
        return 2
    for page, render in PAGES.items():
        (REPO / page).write_text(render())
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
