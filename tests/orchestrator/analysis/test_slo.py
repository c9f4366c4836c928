"""One definition of a good request (loadshapes.slo): its SQL form in the analysis gives the same answers, and a
category's deadlines replace the campaign's one by one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from loadshapes.slo import Deadlines, SloConfig
from orchestrator.analysis.opmap.slo import met_sql
from orchestrator.analysis.read.source import request_frame
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table

SLOS = [
    SloConfig(),
    SloConfig(ttft_s=None, tpot_s=None),
    SloConfig(
        ttft_s=1.0,
        tpot_s=0.05,
        e2e_s=5.0,
        per_category={"reasoning": Deadlines(ttft_s=3.0), "code": Deadlines(tpot_s=0.5, e2e_s=20.0)},
    ),
]


def test_a_category_replaces_only_the_deadlines_it_sets() -> None:
    slo = SLOS[2]
    assert slo.for_category("reasoning") == Deadlines(ttft_s=3.0, tpot_s=0.05, e2e_s=5.0)
    assert slo.for_category("code") == Deadlines(ttft_s=1.0, tpot_s=0.5, e2e_s=20.0)
    assert slo.for_category("chat") == slo.for_category(None) == Deadlines(ttft_s=1.0, tpot_s=0.05, e2e_s=5.0)


@pytest.mark.parametrize("slo", SLOS)
def test_the_analysis_judges_every_request_as_deadlines_met_does(slo: SloConfig) -> None:
    rows = list(
        itertools.product(
            ["ok", "error"],
            ["chat", "reasoning", "code", None],
            [None, 0.5, 1.0, 2.0, 3.5],  # ttft
            [None, 0.01, 0.05, 0.2, 0.6],  # tpot (None: a one-token answer)
            [None, 1.0, 5.0, 10.0, 30.0],  # e2e
        )
    )
    status, category, ttft, tpot, e2e = (list(column) for column in zip(*rows, strict=True))
    table = trace_table(
        arm=["a"] * len(rows), scheduled_ns=START_NS + np.arange(len(rows)) * 10**6, status=status,
        category=category, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e,
    )  # fmt: skip
    requests = request_frame(table)
    judged = requests.con.execute(
        f"SELECT ok, category, ttft, tpot, e2e, {met_sql(slo)} FROM requests ORDER BY offset_s"
    ).fetchall()
    assert len(judged) == len(rows)
    for ok, cat, ttft_s, tpot_s, e2e_s, met in judged:
        assert met == slo.met(cat, ok=ok, ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=e2e_s), (ok, cat, ttft_s, tpot_s, e2e_s)
    assert 0 < sum(row[-1] for row in judged) < len(rows) or slo.ttft_s is None
