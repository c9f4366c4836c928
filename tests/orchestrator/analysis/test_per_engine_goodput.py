"""Per-engine goodput (a data-parallel arm against `off` on one engine) decides only where a side failed users
(issue 40): traces whose SLO misses are planted, so each side's met share, and with it the verdict the words must
carry, is known before the map is computed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadshapes.slo import SloConfig
from orchestrator.analysis.opmap.bands import rate_bands
from orchestrator.analysis.opmap.operating_map import operating_map
from orchestrator.analysis.opmap.results import Verdict
from orchestrator.analysis.opmap.speedup import CARRIED_SHARE
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import request_frame
from serve_apps.policies import FixedPolicy, OffPolicy
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table

OFF = ArmInfo.from_policy("off", OffPolicy())
DP = ArmInfo.from_policy("dp", FixedPolicy(method="ngram", k=3)).model_copy(
    update={"compared_with": "off", "engines_ratio": 2.0}
)
SLO = SloConfig(ttft_s=2.0, tpot_s=0.05)
N = 400


def _trace(off_misses: int, dp_misses: int) -> tuple[float, object]:
    """N paired requests; dp's per-token latency is off's / 2 (a planted 2x), and each arm misses the TTFT SLO
    (2 s) on its first `*_misses` requests (a 5 s first token; per-token latency untouched)."""
    rng = np.random.default_rng(7)
    base = rng.uniform(0.01, 0.03, N)
    off_ttft, dp_ttft = np.full(N, 0.1), np.full(N, 0.1)
    off_ttft[:off_misses] = 5.0
    dp_ttft[:dp_misses] = 5.0
    tpot = np.concatenate([base, base / 2])
    rows = {
        "arm": ["off"] * N + ["dp"] * N,
        "request_id": [f"off:s:0:{i}" for i in range(N)] + [f"dp:s:0:{i}" for i in range(N)],
        "scheduled_ns": np.tile(START_NS + np.arange(N) * 10**8, 2),
        "ttft_s": np.concatenate([off_ttft, dp_ttft]),
        "tpot_s": tpot,
        "e2e_s": np.concatenate([off_ttft, dp_ttft]) + 100 * tpot,
    }
    frame = request_frame(trace_table(**rows), offered_rate=np.full(2 * N, 10.0))
    result = operating_map(frame, [OFF, DP], SLO, rate_bands([0, math.inf]))
    cell = result.cell("0+", "dp")
    assert cell is not None and cell.speedup is not None
    # The reference: goodput per engine from the planted shares (same clock on both sides), by hand
    expected = (N - dp_misses) / (N - off_misses) / 2
    return expected, cell.speedup


@pytest.mark.parametrize(
    ("off_misses", "dp_misses", "goodput", "verdict", "words"),
    [
        # 3 misses in 400 (99.25%, as issue 40's 3 in 2408): both carried: per-token latency decides, helps
        (3, 0, Verdict.INCONCLUSIVE, Verdict.HELPS, "inconclusive: both carried the load (100.0% of the arm's"),
        # off failed 30% of its users, dp none: dp's per-engine goodput (0.71x) only bounds its capacity from
        # below, so it cannot say hurts
        (120, 0, Verdict.INCONCLUSIVE, Verdict.HELPS, "the arm carried the load and off did not (100.0% of the arm"),
        # both failed users (off 30%, dp 60%): goodput per engine is capacity per engine and decides: hurts
        (120, 240, Verdict.HURTS, Verdict.HURTS, "hurts on goodput: goodput per engine 0.29x ["),
        # off carried, dp failed 60%: an upper bound that is below 1 still says hurts
        (0, 240, Verdict.HURTS, Verdict.HURTS, "hurts on goodput: goodput per engine 0.20x ["),
    ],
)
def test_per_engine_goodput_decides_only_where_a_side_failed_users(
    off_misses: int, dp_misses: int, goodput: Verdict, verdict: Verdict, words: str
) -> None:
    expected, speedup = _trace(off_misses, dp_misses)
    assert speedup.goodput.point == pytest.approx(expected)
    assert speedup.goodput.verdict is goodput and speedup.verdict is verdict, speedup.message
    assert words in speedup.message
    assert speedup.tpot.point == pytest.approx(2.0) and speedup.tpot.verdict is Verdict.HELPS
    if goodput is Verdict.INCONCLUSIVE:
        assert speedup.decided_by == "per-token latency"


def test_the_tolerance_is_the_one_the_words_state() -> None:
    # One miss more than the tolerance allows on a side: no longer "carried", the ratio decides (both failed)
    misses = math.floor(N * (1 - CARRIED_SHARE)) + 1
    _, speedup = _trace(misses, misses)
    assert speedup.goodput.verdict is Verdict.HURTS and "carried" not in speedup.message
    _, speedup = _trace(misses - 1, misses - 1)
    assert f"at least {100 * CARRIED_SHARE:.1f}% is carrying" in speedup.message
