"""Each arm's executed engine steps: a (batch size, k) histogram and the binned cross_and_recover runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from loadshapes.shapes import CrossAndRecover, ShapeBase
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import Requests, RunKey
from orchestrator.analysis.verify.recovery import BinnedRun, binned_runs
from orchestrator.analysis.verify.settings import VerifySettings

# The rows' per-step lists, zipped (only the steps both lists report) and numbered within the request.
_LIST_STEPS = """
SELECT t.arm, t.shape, t.run, t.repeat,
       unnest(t.step_batch_size[1:n]) AS batch_size, unnest(t.step_k[1:n]) AS k, unnest(range(1, n + 1)) AS position,
       n, t.begin_ns, t.end_ns
FROM (
    SELECT *, least(coalesce(len(step_batch_size), 0), coalesce(len(step_k), 0)) AS n,
           coalesce(server_first_scheduled_ns, sent_ns, scheduled_ns) AS begin_ns,
           coalesce(server_done_ns, done_ns) AS end_ns
    FROM trace WHERE arm IN (SELECT unnest(?::VARCHAR[]))
) t
"""


# An endpoint arm's steps (a foreign server: no step timeline, no step_batch_size / step_k in its rows): the
# executed k of each drafting step from per_step_drafted, placed evenly between the request's first token and its
# end, and the batch at that time from the server's /metrics samples (the latest sample at or before it, the
# running requests over the engines reporting them).
_ENDPOINT_STEPS = """
SELECT s.arm, s.shape, s.run, s.repeat, s.k, s.position, s.n, s.time_ns,
       CASE WHEN m.running IS NOT NULL
            THEN greatest(round(m.running / greatest(m.engines, 1)), 1)::INTEGER END AS batch_size
FROM (
    SELECT *, (begin_ns + (end_ns - begin_ns) * ((position - 0.5) / n))::BIGINT AS time_ns
    FROM (
        SELECT t.arm, t.shape, t.run, t.repeat, unnest(t.per_step_drafted) AS k,
               unnest(range(1, len(t.per_step_drafted) + 1)) AS position, len(t.per_step_drafted) AS n,
               coalesce(t.first_token_ns, t.sent_ns, t.scheduled_ns) AS begin_ns,
               greatest(coalesce(t.done_ns, t.first_token_ns, t.sent_ns, t.scheduled_ns),
                        coalesce(t.first_token_ns, t.sent_ns, t.scheduled_ns)) AS end_ns
        FROM trace t
        WHERE t.arm IN (SELECT unnest(?::VARCHAR[])) AND len(t.per_step_drafted) > 0
    )
) s
ASOF LEFT JOIN endpoint_samples m
    ON s.arm = m.arm AND s.shape = m.shape AND s.repeat = m.repeat AND s.time_ns >= m.time_ns
"""


@dataclass(frozen=True)
class StepCounts:
    histogram: np.ndarray  # (arms, batch sizes 0..batch_limit, k)
    mismatched_requests: int  # step_k and step_batch_size of different lengths: only their common steps count
    steps_without_k: dict[str, int]  # per arm, timeline steps that reported no k (left out)
    steps_without_batch: dict[str, int]  # per endpoint arm, drafting steps with no /metrics sample (left out)
    # per arm, timeline steps in which vLLM 0.33+ (model runner V2) proposed no drafts because no scheduled
    # request could use them (the timeline's drafts_skipped): left out, whatever k they report
    steps_skipped_drafts: dict[str, int] = field(default_factory=dict)


def step_counts(
    requests: Requests, arms: Sequence[ArmInfo], batch_limit: int, endpoint_arms: Sequence[str] = ()
) -> StepCounts:
    names = [a.name for a in arms]
    timeline_arms = [n for n in names if n in requests.step_arms]
    list_arms = [n for n in names if n not in requests.step_arms and n not in endpoint_arms]
    found: list[tuple[str, int, int, int]] = []
    without_k: dict[str, int] = {}
    skipped: dict[str, int] = {}
    without_batch: dict[str, int] = {}
    if endpoint_arms:
        for arm, batch, k, count in requests.con.execute(
            f"SELECT arm, least(batch_size, {batch_limit}), k, count(*) FROM ({_ENDPOINT_STEPS}) GROUP BY ALL",
            [list(endpoint_arms)],
        ).fetchall():
            if batch is None:
                without_batch[arm] = without_batch.get(arm, 0) + int(count)
            else:
                found.append((arm, int(batch), int(k), int(count)))
    clip = f"least(greatest(batch_size, 0), {batch_limit})"
    if timeline_arms:
        for arm, batch, k, drafts_skipped, count in requests.con.execute(
            f"SELECT arm, {clip}, k, drafts_skipped, count(*) FROM steps WHERE arm IN (SELECT unnest(?::VARCHAR[])) "
            "GROUP BY ALL",
            [timeline_arms],
        ).fetchall():
            if drafts_skipped:
                skipped[arm] = skipped.get(arm, 0) + int(count)
            elif k is None:
                without_k[arm] = without_k.get(arm, 0) + int(count)
            else:
                found.append((arm, int(batch), int(k), int(count)))
    mismatched = 0
    if list_arms:
        found += [
            (arm, int(batch), int(k), int(count))
            for arm, batch, k, count in requests.con.execute(
                f"SELECT arm, {clip}, k, count(*) FROM ({_LIST_STEPS}) GROUP BY ALL", [list_arms]
            ).fetchall()
        ]
        row = requests.con.execute(
            "SELECT count(*) FROM trace WHERE arm IN (SELECT unnest(?::VARCHAR[])) "
            "AND coalesce(len(step_batch_size), 0) <> coalesce(len(step_k), 0)",
            [list_arms],
        ).fetchone()
        mismatched = int(row[0]) if row else 0
    k_width = max((k for _, _, k, _ in found), default=0) + 1
    histogram = np.zeros((len(arms), batch_limit + 1, k_width), dtype=np.int64)
    for arm, batch, k, count in found:
        histogram[names.index(arm), batch, k] += count
    return StepCounts(
        histogram=histogram, mismatched_requests=mismatched, steps_without_k=without_k,
        steps_without_batch=without_batch, steps_skipped_drafts=skipped,
    )  # fmt: skip


def binned_step_runs(
    requests: Requests, arms: Sequence[ArmInfo], shapes: Mapping[str, ShapeBase], settings: VerifySettings
) -> list[BinnedRun]:
    """The steps of the load-switching arms' cross_and_recover runs, in time (seconds from the run's start) and binned:
    from the timeline where the arm has one, else each request's steps spread evenly over its time in the engine."""
    wanted = [a.name for a in arms if a.facts.switches_with_load]
    cross = [name for name, shape in shapes.items() if isinstance(shape, CrossAndRecover)]
    if not wanted or not cross:
        return []
    from_timeline = [a for a in wanted if a in requests.step_arms]
    from_lists = [a for a in wanted if a not in requests.step_arms]
    parts: list[str] = []
    params: list[object] = []
    if from_timeline:
        # The filters on arm and shape let DuckDB skip the other timelines' files (steps joins them by name).
        parts.append(
            """
            SELECT r.run_id, (s.start_ns - r.start_ns) / 1e9 AS time_s, s.batch_size, s.k
            FROM steps s JOIN runs r ON s.arm = r.arm AND s.shape = r.shape AND s.repeat = r.repeat
            WHERE s.k IS NOT NULL AND NOT s.drafts_skipped AND s.arm IN (SELECT unnest(?::VARCHAR[]))
              AND s.shape IN (SELECT unnest(?::VARCHAR[]))
            """
        )
        params += [from_timeline, cross]
    if from_lists:
        parts.append(
            f"""
            SELECT r.run_id,
                   (l.begin_ns::DOUBLE - r.start_ns::DOUBLE
                    + CASE WHEN l.end_ns >= l.begin_ns THEN (l.end_ns - l.begin_ns)::DOUBLE END
                      * ((l.position - 0.5) / l.n)) / 1e9 AS time_s,
                   l.batch_size, l.k
            FROM ({_LIST_STEPS}) l JOIN runs r USING (arm, shape, run, repeat)
            WHERE l.shape IN (SELECT unnest(?::VARCHAR[]))
            """
        )
        params += [from_lists, cross]
    return binned_runs(
        requests.con, " UNION ALL ".join(parts), params, run_ids(requests), arms, shapes, bin_s=settings.bin_s,
        reference=settings.reference,
    )  # fmt: skip


def run_ids(requests: Requests) -> list[tuple[int, RunKey]]:
    """Every run the trace has rows of: its id in the views and its (arm, shape, run, repeat)."""
    return [
        (int(run_id), (str(arm), str(shape), str(run), int(repeat)))
        for run_id, arm, shape, run, repeat in requests.con.execute(
            "SELECT run_id, arm, shape, run, repeat FROM runs"
        ).fetchall()
    ]


def endpoint_step_arms(requests: Requests, samples: pa.Table | None, names: Sequence[str]) -> list[str]:
    """Arms with /metrics samples whose rows carry no step lists of their own (a foreign server, not a
    specdrill arm behind an endpoint URL): their steps come from per_step_drafted. Registers the samples."""
    if samples is None or not samples.num_rows:
        return []
    requests.con.register("endpoint_samples", samples)
    sampled = sorted({str(a) for a in samples.column("arm").to_pylist()} & set(names))
    with_lists = {
        str(r[0])
        for r in requests.con.execute(
            "SELECT DISTINCT arm FROM trace WHERE len(step_k) > 0 AND arm IN (SELECT unnest(?::VARCHAR[]))", [sampled]
        ).fetchall()
    }
    return [a for a in sampled if a not in with_lists and a not in requests.step_arms]
