"""Goodput in SQL: loadshapes.slo's rule (`Deadlines.met`) over the request view's columns (ok, ttft, tpot, e2e,
category), so DuckDB judges every request as the live counter and the simulator do.
tests/orchestrator/analysis/test_slo.py holds the two forms to the same answers."""

from __future__ import annotations

from loadshapes.slo import Deadlines, SloConfig
from orchestrator.analysis.read.db import sql_string


def _deadline_sql(slo: SloConfig, name: str) -> str:
    """The deadline `name` of each request's category, NULL where none applies."""

    def value(deadlines: Deadlines) -> str:
        limit = getattr(deadlines, name)
        return "NULL" if limit is None else repr(float(limit))

    cases = " ".join(
        f"WHEN category = {sql_string(c)} THEN {value(slo.for_category(c))}" for c in sorted(slo.per_category)
    )
    default = value(slo.for_category(None))
    return f"(CASE {cases} ELSE {default} END)" if cases else default


def met_sql(slo: SloConfig) -> str:
    """Deadlines.met as a SQL expression: completed and within every deadline that applies; a missing TTFT or
    end-to-end misses a deadline that is set; a one-token answer (no per-token latency) cannot miss the per-token
    one."""
    ttft, tpot, e2e = (_deadline_sql(slo, n) for n in ("ttft_s", "tpot_s", "e2e_s"))
    return (
        f"(ok AND ({ttft} IS NULL OR coalesce(ttft <= {ttft}, false)) "
        f"AND ({e2e} IS NULL OR coalesce(e2e <= {e2e}, false)) "
        f"AND NOT coalesce(tpot > {tpot}, false))"
    )
