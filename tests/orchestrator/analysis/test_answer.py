"""The answer first (orchestrator/analysis/answer.py): the words printed for the hard cases, on simulated runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from loadshapes.slo import SloConfig
from orchestrator.analysis.answer import answer_of
from orchestrator.analysis.opmap.bands import rate_bands
from orchestrator.analysis.opmap.operating_map import operating_map
from orchestrator.analysis.opmap.results import Verdict, VerificationReport
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.source import request_frame
from orchestrator.analysis.summary import Summary
from orchestrator.plan.campaign import Campaign
from orchestrator.report.build import print_report, write_report
from orchestrator.virtual.campaign import simulate_campaign
from serve_apps.policies import FixedPolicy, OffPolicy
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table
from tests.tiny_campaigns import DYN, sim_campaign

CHAT = {"entries": [{"workload": "chat", "weight": 1}]}


def short_campaign(output: Path, *, arms: list[dict[str, str]], shapes: dict[str, Any], **changes: Any) -> Campaign:
    return Campaign.model_validate(sim_campaign(output.name, **{
        "policies": {"off": "off", "fixed2": "fixed:2", "fixed3": "fixed:3", "dyn": DYN},
        "topologies": {"single": "single", "dp2": "data_parallel:2"},
        "arms": arms, "shapes": shapes, "mix": CHAT, "warmup": {"requests": 0},
        "gates": {"exempt_arms": [a for a in ("dyn-dp2",) if any(x["topology"] == "dp2" for x in arms)]},
        "output": str(output), **changes,
    }))  # fmt: skip


def run_and_report(campaign: Campaign) -> tuple[Summary, str]:
    store, _ = simulate_campaign(campaign)
    summary = write_report(store.root)
    console = Console(width=400, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    print_report(summary, console)
    return summary, console.export_text()


SINGLE = [{"policy": "off", "topology": "single"}, {"policy": "fixed3", "topology": "single"},
          {"policy": "dyn", "topology": "single"}]  # fmt: skip
BUSY = {"ramp": {"kind": "ramp", "rate_from": 2, "rate_to": 14, "duration_s": 16}}


@pytest.fixture(scope="module")
def nine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Summary, str]:
    arms = [{"policy": "off", "topology": "single"}, {"policy": "fixed2", "topology": "single"},
            {"policy": "dyn", "topology": "single"}]  # fmt: skip
    campaign = short_campaign(
        tmp_path_factory.mktemp("nine") / "nine", arms=arms,
        shapes={"quiet": {"kind": "quiet", "rate": 1, "duration_s": 9}}, seed=3,
    )  # fmt: skip
    return run_and_report(campaign)


def test_a_short_campaign_is_insufficient_data_with_n_and_what_is_needed(nine: tuple[Summary, str]) -> None:
    summary, printed = nine
    assert summary.answer is not None
    assert all(b.status == "insufficient_data" and not b.best for b in summary.answer.bands)
    reached = [b for b in summary.answer.bands if b.requests > 0]
    assert {b.measure for b in reached} == {"batch_size", "offered_rate"}
    for band in reached:
        assert band.requests < 20
        factor = -(-20 // band.requests)
        assert (
            f"insufficient data: n = {band.requests} per arm, 20 needed for a verdict: about {factor}x as many "
            f"requests (repeats: {factor})" in band.message
        )
        assert band.message in printed
    unreached = [b for b in summary.answer.bands if b.measure == "batch_size" and b.requests == 0]
    assert unreached and all(b.message not in printed for b in unreached)  # one line for them all instead
    assert "batch 5-12, batch 13-512 (single): the campaign's shapes never ran this hardware at these batch sizes" in (
        printed
    )
    assert "is best" not in printed and "tie for best" not in printed
    assert "crossover by batch size: fixed2-single: no band with enough data" in printed
    # The answer comes before the maps.
    assert printed.index("answer (") < printed.index("operating map by batch size")


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Summary, str]:
    return run_and_report(short_campaign(tmp_path_factory.mktemp("busy") / "busy", arms=SINGLE, shapes=BUSY))


def test_arms_are_compared_pairwise_and_the_best_beats_every_other(busy: tuple[Summary, str]) -> None:
    summary, printed = busy
    assert summary.answer is not None
    by_band = {(c.measure, c.band, frozenset((c.arm, c.other))): c for c in summary.answer.comparisons}
    # Every pair of arms (not only against off) is compared in every band with data.
    assert {frozenset(("dyn-single", "fixed3-single"))} <= {p for _, _, p in by_band}
    decided = [b for b in summary.answer.bands if b.status in ("best", "plain_decoding")]
    assert decided
    for band in decided:
        (best,) = band.best
        for other in {"off-single", "fixed3-single", "dyn-single"} - {best}:
            found = by_band[(band.measure, band.band, frozenset((best, other)))].seen_from(best)
            assert found.verdict is Verdict.HELPS
            low = found.deciding().low
            assert low is not None and low > 1
            assert f"vs {other} " in band.message and f"(n={found.pairs})" in band.message
        assert band.message in printed
    # Where the schedule runs k = 1 or 0 (batch 5+), fixed k = 3 is faster on the same requests, and it says so.
    busier = [b for b in summary.answer.bands if b.measure == "batch_size" and b.band_index > 0 and b.status == "best"]
    assert busier and all(b.best == ["fixed3-single"] and "vs dyn-single per-token" in b.message for b in busier)
    # A pairwise claim agrees with the map's per-cell medians: the best arm has the lowest TPOT p50 of its band.
    for band in busier:
        cells = {c.arm: c for c in summary.maps[0].cells if c.band_index == band.band_index}
        assert min(cells, key=lambda a: cells[a].tpot_s.p50 or 0) == "fixed3-single"


def test_a_dp_arm_without_off_on_its_topology_is_said_to_be_compared_per_engine(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    arms = [*SINGLE, {"policy": "dyn", "topology": "dp2"}]
    summary, printed = run_and_report(short_campaign(tmp_path_factory.mktemp("dp") / "dp", arms=arms, shapes=BUSY))
    assert "dyn-dp2 (data_parallel2) has no `off` on its topology: compared only per engine with off-single" in printed
    dp_cells = [c for c in summary.maps[1].cells if c.arm == "dyn-dp2" and c.speedup is not None]
    carried = [c for c in dp_cells if c.speedup is not None and c.speedup.goodput.verdict is Verdict.INCONCLUSIVE]
    # Two engines carrying what one carried: per-engine goodput is 1/2 by construction, never "hurts".
    assert carried and all(c.speedup is not None and c.speedup.verdict is not Verdict.HURTS for c in carried)
    assert all(
        "goodput per engine 0.50x inconclusive: both carried the load" in c.speedup.message
        for c in carried if c.speedup is not None
    )  # fmt: skip
    assert "what ran:" in printed and "vLLM's data-parallel fallback" in printed
    # Its crossover is not a verdict on equal hardware, and says so (issue 33: "dyn-dp2: helps in every band")
    dp_crossovers = [line for line in summary.answer.crossovers if "dyn-dp2" in line] if summary.answer else []
    assert dp_crossovers and all("per engine against off-single, not on equal hardware" in x for x in dp_crossovers)


def test_a_dp_arm_with_off_dp2_is_compared_on_its_own_hardware(tmp_path_factory: pytest.TempPathFactory) -> None:
    arms = [*SINGLE, {"policy": "off", "topology": "dp2"}, {"policy": "dyn", "topology": "dp2"}]
    out = tmp_path_factory.mktemp("dp") / "dp2"
    summary, printed = run_and_report(short_campaign(out, arms=arms, shapes=BUSY))
    assert summary.answer is not None
    assert "has no `off` on its topology" not in printed
    dp = [b for b in summary.answer.bands if b.hardware == "data_parallel2" and b.status == "best"]
    assert dp and all(b.best == ["dyn-dp2"] and "vs off-dp2 per-token" in b.message for b in dp)
    assert not any("off-single" in b.message for b in summary.answer.bands if b.hardware == "data_parallel2")
    assert "dyn-dp2: ran the static max k = 3" in printed and "its cells measure what ran, not its policy" in printed
    # issue 40: never crowned unmarked. The reference for what ran: the steps themselves (every dyn-dp2 step's k,
    # read from its traces here, not from the verification), and DYN's max k, 3
    assert _executed_ks(out, "dyn-dp2") == {3}
    instead = "schedule dropped, static k = 3 ran in 100.0% of steps"
    assert all(b.ran_instead == {"dyn-dp2": instead} for b in dp)
    assert all(f"dyn-dp2 (not as configured: {instead}) is best" in b.message and b.message in printed for b in dp)
    marked = [x for x in summary.answer.crossovers if ": dyn-dp2" in x]
    assert marked and all(x.endswith(f"; dyn-dp2 did not run as configured: {instead}") for x in marked)
    headline = [h for h in summary.headline if "] dyn-dp2" in h]
    assert headline and all(h.endswith(f"did not run as configured: {instead}") for h in headline)
    # The verifier's line leads with what failed, never with a share that reads like a pass
    line = next(x for x in printed.splitlines() if x.strip().startswith("FAIL dyn-dp2"))
    assert "(dynamic, data_parallel2): schedule dropped, static k = 3 ran in 100.0% of steps (executed k" in line
    # report.html's Answer table: dyn-dp2 never in green without the mark; the arms that ran as configured are
    import re

    section = (out / "report.html").read_text().split('<section class="answer">')[1].split("</section>")[0]
    table = section.split("<details>")[0]  # both maps' tables and the notes under them
    mark = r'( <span class="unverified"[^>]*>\u26a0</span>)?'
    crowned = re.findall(r'<span class="v (v-[a-z_]+)">dyn-dp2</span>' + mark, table)
    assert crowned and all(c == "v-no_difference" and f'title="not as configured: {instead}"' in m for c, m in crowned)
    # what ran instead, said once under the tables
    assert table.count(f'<p class="unverified">\u26a0 dyn-dp2 did not run as configured: {instead}</p>') == 1
    assert '<span class="v v-helps">fixed3-single</span> <span class="muted">' in table
    # The arms that ran their policies carry no mark
    assert not any(b.ran_instead for b in summary.answer.bands if b.hardware == "single")


def _executed_ks(run: Path, arm: str) -> set[int]:
    """Every k the arm's engine steps executed, read from its step timelines (the verification's input, not its
    output)."""
    import duckdb

    found = duckdb.sql(f"SELECT DISTINCT k FROM read_parquet('{run}/timelines/arm={arm}/**/*.parquet')")
    return {int(k) for (k,) in found.fetchall()}


def test_an_off_arm_alone_has_nothing_to_compare_with(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One `off` arm: not "insufficient data: n = 101 per arm, 20 needed" per band, but one line saying why."""
    arms = [{"policy": "off", "topology": "single"}]
    summary, printed = run_and_report(short_campaign(tmp_path_factory.mktemp("one") / "one", arms=arms, shapes=BUSY))
    assert summary.answer is not None
    assert "single: nothing to compare with: off-single is the only arm on this hardware" in printed
    assert "insufficient data" not in "\n".join(summary.answer.lines)


def test_bands_the_traffic_never_filled_are_not_unreached_load(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A constant rate of 2 req/s never runs batch 13+: said once as not measured, never as load that was tried
    and not reached, and never as a band needing repeats."""
    shapes = {"flat": {"kind": "quiet", "rate": 2, "duration_s": 20}}
    summary, printed = run_and_report(short_campaign(tmp_path_factory.mktemp("flat") / "flat", arms=SINGLE,
                                                     shapes=shapes, load={"process": "constant"}))  # fmt: skip
    assert summary.answer is not None
    lines = summary.answer.lines
    assert "reached this load" not in printed
    empty = [line for line in lines if "never ran this hardware at these batch sizes" in line]
    assert len(empty) == 1 and "batch 13-512" in empty[0]
    assert not any("batch 13-512" in line and "repeats" in line for line in lines)


def test_an_slo_no_request_meets_is_said_beside_the_verdicts(tmp_path_factory: pytest.TempPathFactory) -> None:
    summary, _ = run_and_report(
        short_campaign(tmp_path_factory.mktemp("slo") / "slo", arms=SINGLE, shapes=BUSY,
                       slo={"ttft_s": 0.001, "tpot_s": 0.001})
    )  # fmt: skip
    assert summary.answer is not None
    assert any(b.status == "best" for b in summary.answer.bands)  # verdicts on per-token latency still stand
    warning = [line for line in summary.answer.lines if "no completed request met the SLOs" in line]
    assert len(warning) == 1 and "per-token latency alone" in warning[0]


def test_an_arm_whose_off_arm_has_no_data_is_said_once_never_a_keyerror() -> None:
    """A run stopped before any `off` unit completed: the map has no baseline (""), and the answer says which
    arm has nothing to compare with instead of failing on it (issue 33: `KeyError: ''`)."""
    off = ArmInfo.from_policy("off-single", OffPolicy(), compared_with=None)
    fixed = ArmInfo.from_policy("fixed3-single", FixedPolicy(method="ngram", k=3), compared_with="off-single")
    n = 40
    frame = request_frame(
        trace_table(arm=["fixed3-single"] * n, scheduled_ns=[START_NS + i * 10**8 for i in range(n)],
                    ttft_s=[0.1] * n, tpot_s=[0.01] * n, e2e_s=[1.0] * n),
        offered_rate=np.full(n, 5.0),
    )  # fmt: skip
    maps = [operating_map(frame, [off, fixed], SloConfig(), rate_bands([0, math.inf]))]
    assert maps[0].baseline == "" and "fixed3-single" not in maps[0].baselines
    verification = VerificationReport(arms=[], switch_timings=[], passed=True)
    found = answer_of(maps, [], verification, [off, fixed])
    assert "  fixed3-single: its `off` arm (off-single) has no data in this run: nothing to compare it with" in (
        found.lines
    )
    assert not found.bands
