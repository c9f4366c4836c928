"""The trace rows of a unit played in virtual time, as the load worker writes them (FILE_SCHEMA), built column
by column."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from loadshapes.shapes import ShapeBase
from loadshapes.sse import cancelled_message, stream_error_message
from loadshapes.trace import FILE_SCHEMA
from orchestrator.plan.campaign import Campaign
from orchestrator.virtual.arrays import (
    column,
    concat,
    latency_arrays,
    list_column,
    segments,
    spec_arrays,
    step_summary_columns,
    to_ns,
)
from orchestrator.virtual.traffic import Sent, UnitRun
from orchestrator.virtual.twins import VirtualEngine
from serve_apps.arms import ArmSpec
from serve_apps.sim.request import RequestRecord

_NEVER = np.iinfo(np.int64).max

OK, TIMEOUT, CANCELLED, ERROR = range(4)
_STATUS = ("ok", "timeout", "cancelled", "error")
_ERROR_CLASS = (None, "timeout", "drain_timeout", "server_error")


@dataclass(frozen=True)
class RowContext:
    campaign: str
    run: str
    policy: str | None
    topology: str | None
    start_ns: int
    time_scale: float
    request_timeout_s: float
    store_token_times: bool
    store_prompts: bool
    speculative: bool  # the engine runs a drafter (vLLM reports metrics.speculative_decoding)
    repeat: int = 0
    shape: ShapeBase | None = None  # its rate at each scheduled offset is the row's offered rate (open loop)
    store_step_lists: bool = False

    @classmethod
    def of(cls, campaign: Campaign, arm: ArmSpec, shape: str, repeat: int, *, run: str, start_ns: int,
           time_scale: float, stored: bool = True) -> RowContext:  # fmt: skip
        """The context of an arm's unit; `stored` False: without what only a trace file keeps (token times,
        prompts, per-step lists), for rows read in memory."""
        load = campaign.load
        return cls(
            campaign=campaign.name, run=run, policy=arm.policy.label, topology=arm.topology.label, start_ns=start_ns,
            time_scale=time_scale, request_timeout_s=load.request_timeout_s,
            store_token_times=stored and load.store_token_times, store_prompts=stored and campaign.store_prompts,
            speculative=arm.policy.resolve(arm.topology).num_speculative_tokens > 0, repeat=repeat,
            shape=campaign.shapes[shape], store_step_lists=stored and load.store_step_lists,
        )  # fmt: skip


def trace_table(ctx: RowContext, run: UnitRun, engines: Sequence[VirtualEngine]) -> pa.Table:
    """One row per scheduled request, as the load worker writes it (FILE_SCHEMA: the partition columns live in
    the path), built column by column: a simulated hour is ~10^5 rows."""
    sent = run.sent
    n = len(sent)
    scale = ctx.time_scale
    scheduled = ctx.start_ns + np.rint(np.fromiter((s.at_s for s in sent), np.float64, n) * 1e9).astype(np.int64)
    stops = {w: ctx.start_ns + round(t * 1e9) for w, t in run.stops.items()}
    stop_ns = np.fromiter((stops[s.worker] for s in sent), np.int64, n)  # each worker stops on its own
    deadline = scheduled + round(ctx.request_timeout_s * 1e9)
    record_list = [run.records.get(s.request_id) if s.request else None for s in sent]
    has_record = np.fromiter((r is not None for r in record_list), bool, n)
    refused = np.fromiter((s.error is not None for s in sent), bool, n)
    done = np.full(n, _NEVER, dtype=np.int64)
    rec_rows = np.flatnonzero(has_record)
    recs = _records_at(record_list, rec_rows)
    done[rec_rows] = to_ns(ctx.start_ns, np.fromiter((r.finished for r in recs), np.float64, len(recs)) * scale)
    status = np.full(n, CANCELLED, dtype=np.int64)
    ok = has_record & (done <= deadline) & (done <= stop_ns)
    status[ok] = OK
    status[~ok & ~refused & (deadline <= stop_ns)] = TIMEOUT  # the client gave up before the workers stopped
    status[refused] = ERROR

    # Tokens: every token of an ok row; those that arrived before the deadline of a timed-out one.
    token_rows = np.flatnonzero(has_record & ((status == OK) | (status == TIMEOUT)))
    token_recs = _records_at(record_list, token_rows)
    raw_lengths = np.fromiter((len(r.token_times) for r in token_recs), np.int64, len(token_recs))
    raw = to_ns(ctx.start_ns, concat([r.token_times for r in token_recs], np.float64) * scale)
    limit = np.where(status[token_rows] == OK, _NEVER, deadline[token_rows])
    keep = raw <= np.repeat(limit, raw_lengths)
    times = raw[keep]
    lengths = np.bincount(segments(raw_lengths)[keep], minlength=len(token_rows)).astype(np.int64)
    latency = latency_arrays(scheduled[token_rows], lengths, times)

    ok_rows = np.flatnonzero(status == OK)
    ok_recs = _records_at(record_list, ok_rows)
    sent_rows = np.flatnonzero(status != CANCELLED)

    columns: dict[str, pa.Array] = {}
    columns["campaign"] = pa.array([ctx.campaign] * n, pa.string())
    columns["run"] = pa.array([ctx.run] * n, pa.string())
    columns["policy"] = pa.array([ctx.policy] * n, pa.string())
    columns["topology"] = pa.array([ctx.topology] * n, pa.string())
    columns["phase"] = pa.array([s.phase for s in sent], pa.string())
    columns["worker"] = pa.array(np.fromiter((s.worker for s in sent), np.int32, n), pa.int32())
    columns["request_id"] = pa.array([s.request_id for s in sent], pa.string())
    columns["repeat"] = pa.array(np.full(n, ctx.repeat, np.int32), pa.int32())
    columns["request_index"] = pa.array(np.fromiter((s.index for s in sent), np.int64, n), pa.int64())
    columns["category"] = pa.array([s.spec.category for s in sent], pa.string())
    columns["session_id"] = pa.nulls(n, pa.int64())  # sessions are refused in virtual time (require_simulated)
    columns["turn"] = pa.nulls(n, pa.int32())
    columns["prompt_sha256"] = pa.array([s.prompt_sha256 for s in sent], pa.string())
    columns["prompt"] = pa.array([s.spec.prompt if ctx.store_prompts else None for s in sent], pa.string())
    columns["scheduled_ns"] = pa.array(scheduled, pa.int64())
    columns["unit_start_ns"] = pa.array(np.full(n, ctx.start_ns, np.int64), pa.int64())
    offsets = np.fromiter((s.at_s for s in sent), np.float64, n)
    columns["offset_s"] = pa.array(offsets, pa.float64())
    if ctx.shape is not None and ctx.shape.open_loop:
        columns["offered_rate_rps"] = pa.array(np.asarray(ctx.shape.rate_at(offsets), np.float64), pa.float64())
    else:
        columns["offered_rate_rps"] = pa.nulls(n, pa.float64())
    columns["sent_ns"] = column(n, sent_rows, scheduled[sent_rows], pa.int64())
    first_token, has_token = latency["first_token_ns"]
    columns["first_token_ns"] = column(n, token_rows[has_token], first_token[has_token], pa.int64())
    columns["done_ns"] = column(n, ok_rows, done[ok_rows], pa.int64())
    columns["send_lateness_ns"] = column(n, sent_rows, np.zeros(len(sent_rows), np.int64), pa.int64())
    prompt_tokens = np.fromiter((s.spec.prompt_tokens for s in sent), np.int32, n)
    columns["prompt_tokens"] = column(n, sent_rows, prompt_tokens[sent_rows], pa.int32())
    # A timed-out stream's usage counts the tokens that arrived; with none, no usage arrived at all.
    columns["output_tokens"] = column(n, token_rows[lengths > 0], lengths[lengths > 0].astype(np.int32), pa.int32())
    columns["ttft_s"] = column(n, token_rows[has_token], latency["ttft_s"][0][has_token], pa.float64())
    columns["e2e_s"] = column(n, ok_rows, (done[ok_rows] - scheduled[ok_rows]) / 1e9, pa.float64())
    for name in ("tpot_s", "itl_p50_s", "itl_p99_s", "itl_max_s"):
        values, valid = latency[name]
        columns[name] = column(n, token_rows[valid], values[valid], pa.float64())
    if ctx.store_token_times:
        columns["token_times_ns"] = list_column(n, token_rows, lengths, times, pa.list_(pa.int64()))
    else:
        columns["token_times_ns"] = pa.nulls(n, pa.list_(pa.int64()))
    columns.update(_telemetry_columns(ctx, n, ok_rows, ok_recs, scheduled, [sent[i].rank for i in ok_rows], engines))
    columns["status"] = pa.array([_STATUS[s] for s in status], pa.string())
    columns["error_class"] = pa.array([_ERROR_CLASS[s] for s in status], pa.string())
    columns["error_message"] = pa.array(
        [_error_message(ctx, sent[i], int(status[i]), int(stop_ns[i] - scheduled[i])) for i in range(n)], pa.string()
    )
    return pa.Table.from_arrays([columns[name] for name in FILE_SCHEMA.names], schema=FILE_SCHEMA)


def _records_at(records: Sequence[RequestRecord | None], rows: np.ndarray) -> list[RequestRecord]:
    picked = [records[i] for i in rows]
    found = [r for r in picked if r is not None]
    assert len(found) == len(picked), "rows picked where a record exists"
    return found


def _error_message(ctx: RowContext, sent: Sent, status: int, waited_ns: int) -> str | None:
    # The load worker's messages: the same functions where their words are the same; its timeout message formats
    # the timeout with :g (loadshapes.wire), this one as the float it is, kept so the traces stay what they were.
    if status == TIMEOUT:
        return f"no complete response within {ctx.request_timeout_s} s"
    if status == CANCELLED:
        return cancelled_message(waited_ns / 1e9)
    if status == ERROR:
        return stream_error_message(sent.error)
    return None


def _telemetry_columns(
    ctx: RowContext,
    n: int,
    rows: np.ndarray,
    records: Sequence[RequestRecord],
    scheduled: np.ndarray,
    ranks: Sequence[int],
    engines: Sequence[VirtualEngine],
) -> dict[str, pa.Array]:
    """What the final chunk's `specdrill` object and metrics.speculative_decoding carry (ok rows only: a
    response cut short never reaches its final chunk)."""
    scale = ctx.time_scale
    out: dict[str, pa.Array] = {}
    out["queue_wait_s"] = column(
        n, rows, np.fromiter(((r.first_scheduled - r.arrival) * scale for r in records), np.float64), pa.float64()
    )
    out["server_received_ns"] = column(n, rows, scheduled[rows], pa.int64())  # no network: received when sent
    for name, attribute in (("server_first_scheduled_ns", "first_scheduled"), ("server_first_token_ns", "first_token"),
                            ("server_done_ns", "finished")):  # fmt: skip
        seconds = np.fromiter((getattr(r, attribute) for r in records), np.float64, len(records)) * scale
        out[name] = column(n, rows, to_ns(ctx.start_ns, seconds), pa.int64())
    step_lengths = np.fromiter((len(r.step_batch_size) for r in records), np.int64, len(records))
    batch = concat([r.step_batch_size for r in records], np.int32)
    executed = concat([r.step_k for r in records], np.int16)
    out.update(step_summary_columns(n, rows, step_lengths, batch, executed))
    if ctx.store_step_lists:
        out["step_batch_size"] = list_column(n, rows, step_lengths, batch, pa.list_(pa.int32()))
        out["step_k"] = list_column(n, rows, step_lengths, executed, pa.list_(pa.int16()))
    else:
        out["step_batch_size"] = pa.nulls(n, pa.list_(pa.int32()))
        out["step_k"] = pa.nulls(n, pa.list_(pa.int16()))
    if ctx.speculative:
        spec = spec_arrays(records)
        verified = spec["steps"] > 0  # vLLM omits the per-step lists of a request that verified no drafts
        segment = segments(spec["steps"])
        for name, total in (("per_step_drafted", "drafted_tokens"), ("per_step_accepted", "accepted_tokens")):
            sums = np.bincount(segment, weights=spec[name], minlength=len(records)).astype(np.int64)
            out[total] = column(n, rows, sums, pa.int64())
            if ctx.store_step_lists:
                out[name] = list_column(
                    n, rows[verified], spec["steps"][verified], spec[name].astype(np.int16), pa.list_(pa.int16())
                )
            else:
                out[name] = pa.nulls(n, pa.list_(pa.int16()))
        out["spec_steps"] = column(n, rows, spec["steps"].astype(np.int32), pa.int32())
        out["mean_acceptance_length"] = column(n, rows, spec["mean_acceptance_length"], pa.float64())
    else:  # no speculation: vLLM sends metrics.speculative_decoding = null
        for name in ("per_step_drafted", "per_step_accepted"):
            out[name] = pa.nulls(n, pa.list_(pa.int16()))
        zeros = np.zeros(len(records), np.int64)
        out["spec_steps"] = column(n, rows, zeros.astype(np.int32), pa.int32())
        out["drafted_tokens"] = column(n, rows, zeros, pa.int64())
        out["accepted_tokens"] = column(n, rows, zeros, pa.int64())
        out["mean_acceptance_length"] = pa.nulls(n, pa.float64())
    for name in ("resolved_speculative_config", "replica_id", "engine_id", "node_id"):
        values: list[Any] = [None] * n
        for row, rank in zip(rows, ranks, strict=True):
            values[row] = engines[rank].constant_columns[name]
        out[name] = pa.array(values, pa.string())
    dropped: list[bool | None] = [None] * n
    for row, rank in zip(rows, ranks, strict=True):
        dropped[row] = engines[rank].constant_columns["schedule_dropped"]
    out["schedule_dropped"] = pa.array(dropped, pa.bool_())
    return out
