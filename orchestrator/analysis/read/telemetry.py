"""Per-arm telemetry totals (rows, drafts, resolved config, dropped schedules), from the trace's footers or rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import Requests


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
