"""report.html on hand-built results: content, escaping, well-formed HTML and SVG, and a headless-browser load."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from loadshapes.shapes import CrossAndRecover, Quiet
from orchestrator.analysis.answer import BandAnswer
from orchestrator.analysis.opmap.bands import batch_bands, rate_bands
from orchestrator.analysis.opmap.results import (
    ArmVerification,
    BandKCheck,
    Crossover,
    Finding,
    MapCell,
    MapSettings,
    OperatingMap,
    Quantiles,
    RatioCI,
    Speedup,
    SwitchTiming,
    Verdict,
    VerificationReport,
)
from orchestrator.analysis.steps.timelines import MAX_POINTS, series_of_table
from orchestrator.report.html import ReportData, render_report_html
from tests import REPO

START_NS = 1_700_000_000 * 10**9
ARMS = ["off", "fixed-k3", "dyn-dp2"]
TITLE = "specdrill report: demo & test"
CROSS = CrossAndRecover(
    quiet_rate=1, peak_rate=20, boundary_rate=8, quiet_s=10, rise_s=10, hold_s=20, fall_s=10, boundary="batch64"
)
# Per band, per non-baseline arm: (TPOT speedup point, verdict); None: no cell at all.
SPEEDUPS: dict[str, list[tuple[float | None, Verdict] | None]] = {
    "fixed-k3": [(1.62, Verdict.HELPS), (1.01, Verdict.NO_DIFFERENCE), (0.81, Verdict.HURTS)],
    "dyn-dp2": [(1.4, Verdict.HELPS), (None, Verdict.INSUFFICIENT_DATA), None],
}


def _q(p50: float) -> Quantiles:
    return Quantiles(p50=p50, p90=p50 * 1.5, p99=p50 * 2.5)


def _speedup(point: float | None, verdict: Verdict) -> Speedup:
    low, high = (None, None) if point is None else (point * 0.93, point * 1.07)
    tpot = RatioCI(point=point, low=low, high=high, verdict=verdict)
    goodput = RatioCI(point=1.05, low=0.98, high=1.12, verdict=Verdict.NO_DIFFERENCE)
    return Speedup(
        baseline="off", paired=True, pairs=180, tpot=tpot, goodput=goodput, verdict=verdict, message=f"{verdict}"
    )


def _cell(band: str, index: int, arm: str, speedup: Speedup | None) -> MapCell:
    tpot = 0.02 * (1 + index) / (speedup.tpot.point or 1 if speedup else 1)
    return MapCell(
        band=band, band_index=index, arm=arm, requests=200, completed=198, error_rate=0.01, clock_s=60.0,
        throughput_rps=3.3 * (index + 1), goodput_rps=3.1 * (index + 1), goodput_fraction=0.94,
        ttft_s=_q(0.08 * (index + 1)), tpot_s=_q(tpot), e2e_s=_q(2.5), queue_wait_s=_q(0.004 * index),
        steps=5000, mean_executed_k=0.0 if arm == "off" else 3.0 - index, acceptance_length=2.1,
        acceptance_length_by_category={"chat": 2.0, "code": None}, speedup=speedup,
    )  # fmt: skip


def _map(measure: str) -> OperatingMap:
    bands = batch_bands([(1, 8), (9, 64), (65, 256)]) if measure == "batch_size" else rate_bands([0, 2, 8, 50])
    cells = []
    for i, band in enumerate(bands.bands):
        cells.append(_cell(band.label, i, "off", None))
        for arm, per_band in SPEEDUPS.items():
            entry = per_band[i]
            if entry is not None:
                cells.append(_cell(band.label, i, arm, _speedup(*entry)))
    return OperatingMap(
        measure=bands.measure, unit=bands.unit, bands=list(bands.bands), baseline="off", arms=ARMS, cells=cells,
        crossovers=[
            Crossover(arm="fixed-k3", band=bands.bands[1].label, band_index=1, message="fixed-k3 stops helping"),
            Crossover(arm="dyn-dp2", band=None, band_index=None, message="dyn-dp2 helps in every band with data"),
        ],
        unbanded={"off": 0, "fixed-k3": 3, "dyn-dp2": 0}, settings=MapSettings(),
    )  # fmt: skip


def _verification() -> VerificationReport:
    fixed = ArmVerification(
        arm="fixed-k3", kind="fixed", topology="single", steps=12000, match_fraction=0.999,
        bands=[BandKCheck(band="1-8", steps=4000, configured_k=[3], executed_k={"3": 0.999, "0": 0.001},
                          mean_executed_k=2.997, match_fraction=0.999, passed=True)],
        findings=[Finding(check="executed_k", arm="fixed-k3", passed=True, message="k=3 on 99.9% of steps")],
        passed=True,
    )  # fmt: skip
    dyn = ArmVerification(
        arm="dyn-dp2", kind="dynamic", topology="data_parallel2", steps=9000, match_fraction=0.41,
        bands=[BandKCheck(band="65-256", steps=3000, configured_k=[1, 0], executed_k={"3": 1.0},
                          mean_executed_k=3.0, match_fraction=0.0, passed=False)],
        findings=[Finding(check="schedule_dropped", arm="dyn-dp2", passed=False, band="65-256",
                          message="vLLM dropped the per-batch-size schedule under data parallelism: ran k=3")],
        passed=False,
    )  # fmt: skip
    timing = SwitchTiming(
        arm="fixed-k3", shape="cross", run="demo-run", repeat=0, reference="shape", crossed_up_s=14.2,
        switched_s=15.0, switch_lag_s=0.8, crossed_down_s=46.0, recovered_s=47.1, recovery_s=1.1, quiet_k=3,
        loaded_k=1, bound_s=5.0, passed=True, message="switched within 0.8 s",
    )  # fmt: skip
    return VerificationReport(arms=[fixed, dyn], switch_timings=[timing], passed=False)


def _timelines() -> pa.Table:
    """fixed-k3: one engine, 6000 steps (bucketed); dyn-dp2: two engines, 400 steps each."""
    rng = np.random.default_rng(0)
    columns: dict[str, list[object]] = {c: [] for c in ("arm", "shape", "repeat", "engine_id", "start_ns", "end_ns")}
    ints: dict[str, list[int]] = {c: [] for c in ("batch_size", "k", "drafted", "accepted", "waiting", "num_prefill")}
    for arm, engines, steps in (("fixed-k3", 1, 6000), ("dyn-dp2", 2, 400)):
        for engine in range(engines):
            starts = np.sort(rng.uniform(0, CROSS.duration, steps))
            batch = np.maximum(1, (CROSS.rate_at(starts) * 6 + rng.normal(0, 2, steps)).astype(int))
            k = np.where(batch > 64, 1, 3)
            for s, b, kk in zip(starts, batch, k, strict=True):
                columns["arm"].append(arm)
                columns["shape"].append("cross")
                columns["repeat"].append(0)
                columns["engine_id"].append(f"{arm}-e{engine}")
                columns["start_ns"].append(START_NS + int(s * 1e9))
                columns["end_ns"].append(START_NS + int((s + 0.01) * 1e9))
                for name, value in (("batch_size", b), ("k", kk), ("drafted", b * kk), ("accepted", b * kk // 2),
                                    ("waiting", 0), ("num_prefill", 1)):  # fmt: skip
                    ints[name].append(int(value))
    return pa.table(
        {
            "arm": pa.array(columns["arm"], pa.string()),
            "shape": pa.array(columns["shape"], pa.string()),
            "repeat": pa.array(columns["repeat"], pa.int64()),
            "engine_id": pa.array(columns["engine_id"], pa.string()),
            "start_ns": pa.array(columns["start_ns"], pa.int64()),
            "end_ns": pa.array(columns["end_ns"], pa.int64()),
            **{name: pa.array(values, pa.int32()) for name, values in ints.items()},
        }
    )


def _manifest() -> dict[str, object]:
    config = {"method": "ngram", "num_speculative_tokens": 3}
    schedule = {**config, "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 512, 1]]}
    return {
        "run": "demo-run",
        "host": {"hostname": "box", "python": "3.11.9"},
        "versions": {"specdrill": "0.1.0", "vllm": None},
        "mode": "virtual",
        "arms": {
            "off": {"policy_label": "off", "topology_label": "single", "engine_kind": "sim",
                    "resolved_speculative_config": None, "schedule_dropped": False},
            "fixed-k3": {"policy_label": "fixed:ngram:k3", "topology_label": "single", "engine_kind": "sim",
                         "resolved_speculative_config": config, "schedule_dropped": False},
            "dyn-dp2": {"policy_label": "dynamic:ngram", "topology_label": "data_parallel2", "engine_kind": "sim",
                        "configured_speculative_config": schedule, "resolved_speculative_config": config,
                        "schedule_dropped": True},
        },
    }  # fmt: skip


def _data(**overrides: object) -> ReportData:
    fields: dict[str, object] = {
        "title": TITLE,
        "run": "demo-run",
        "campaign": "demo",
        "generated": "2025-01-01 12:00:00 UTC",
        "manifest": _manifest(),
        "maps": [_map("batch_size"), _map("offered_rate")],
        "verification": _verification(),
        "timelines": _timelines(),
        "unit_starts": {"fixed-k3/cross/r0": START_NS, "dyn-dp2/cross/r0": START_NS},
        "shapes": {"cross": CROSS, "quiet": Quiet(rate=1, duration_s=10)},
        "headline": ["Data-parallel fallback: <dyn-dp2> ran k=3 & ignored its schedule"],
        "saturated_units": ["fixed-k3/cross/r0"],
        "gate_failures": ["executed policy: dyn-dp2 does not match its schedule"],
    }
    fields.update(overrides)
    return ReportData(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def page() -> str:
    return render_report_html(_data())


SVG_BLOCK = re.compile(r"<svg\b.*?</svg>", re.S)
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _TagBalance(HTMLParser):
    """Counts start/end tags outside SVG's self-closing elements; records mismatches."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        pass  # <line .../> and friends

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()


def test_contains_sections_arms_and_verdicts(page: str) -> None:
    for arm in ARMS:
        assert arm in page
    for text in ("helps", "hurts", "no difference", "insufficient data", "baseline", "no data"):
        assert text in page
    for text in ("gates FAIL", "did not run as configured", "Load generator saturated", "Gate failures",
                 "fixed-k3 stops helping", "Switch timings", "switched within 0.8 s", "fixed:ngram:k3",
                 "data_parallel2", "k=3 99.9%", "1.62x", "0.81x", "seconds since unit start", "batch64"):  # fmt: skip
        assert text in page, text
    assert "&quot;num_speculative_tokens&quot;: 3" in page  # the resolved config, as JSON
    assert page.startswith("<!DOCTYPE html>")


def test_one_svg_per_chart(page: str) -> None:
    maps, units = 2, 2
    # the picture at the top; a heatmap and two band charts per map; one per timeline (the legend's swatches
    # are decoration, aria-hidden)
    assert page.count('role="img"') == 1 + maps * 3 + units
    assert page.count("crossing batch64") == units  # the CrossAndRecover shape's dashed lines are named


def test_no_script_and_nothing_external(page: str) -> None:
    lowered = page.lower()
    assert "<script" not in lowered
    assert "javascript:" not in lowered
    assert not re.search(r"<[^>]+\son\w+=", page)  # no event handlers
    assert "https://" not in lowered and "<img" not in lowered and "<link" not in lowered
    assert set(re.findall(r"url\(([^)]*)\)", lowered)) <= {"#hatch-batch_size", "#hatch-offered_rate"}  # in-page
    assert set(re.findall(r"http://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}


def test_text_is_escaped(page: str) -> None:
    assert "<dyn-dp2>" not in page
    assert "&lt;dyn-dp2&gt; ran k=3 &amp; ignored" in page
    assert "<title>specdrill report: demo &amp; test</title>" in page


def test_html_tags_balance(page: str) -> None:
    parser = _TagBalance()
    parser.feed(page)
    parser.close()
    assert parser.errors == []
    assert parser.stack == []


def test_svg_blocks_are_well_formed_xml(page: str) -> None:
    blocks = SVG_BLOCK.findall(page)
    assert blocks
    for block in blocks:
        root = ET.fromstring(block)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert root.get("viewBox")


def _heatmaps(page: str) -> list[str]:
    return [b for b in SVG_BLOCK.findall(page) if 'aria-label="speedup heatmap' in b]


def test_heatmap_colours_follow_the_speedup(page: str) -> None:
    heatmap = _heatmaps(page)[0]
    fills = {
        title.split(":")[0]: rect.get("fill")
        for rect in ET.fromstring(heatmap).iter("{http://www.w3.org/2000/svg}rect")
        if (title := rect.findtext("{http://www.w3.org/2000/svg}title"))
    }
    assert fills["fixed-k3 @ 1-8"] == "#1a9850"  # 1.62x: full green
    red = fills["fixed-k3 @ 65-256"] or ""
    assert int(red[1:3], 16) > int(red[3:5], 16)  # 0.81x: red dominates
    assert fills["off @ 1-8"] == fills["dyn-dp2 @ 9-64"] == fills["dyn-dp2 @ 65-256"] == "#d9d9d9"


def test_long_timelines_are_downsampled(page: str) -> None:
    shown = dict(re.findall(r"(\d+ steps on \d+ engines?), shown as (\d+) time buckets", page))
    assert MAX_POINTS * 0.9 < int(shown["6000 steps on 1 engine"]) <= MAX_POINTS  # non-empty buckets only
    assert 300 < int(shown["800 steps on 2 engines"]) <= 400  # two engines: bucketed to one series
    for block in SVG_BLOCK.findall(page)[-2:]:
        for path in ET.fromstring(block).iter("{http://www.w3.org/2000/svg}path"):
            assert (path.get("d") or "").count("V") <= MAX_POINTS
    assert len(page) < 400_000


def _x_ticks(page: str, unit: str) -> list[float]:
    """The time-axis tick labels of one unit's timeline chart (the row of labels below the plot)."""
    (block,) = (b for b in SVG_BLOCK.findall(page) if f"time: {unit}" in b)
    texts = list(ET.fromstring(block).iter("{http://www.w3.org/2000/svg}text"))
    row = max(float(t.get("y") or 0) for t in texts if (t.text or "").replace(".", "").isdigit())
    return [float(t.text or "") for t in texts if float(t.get("y") or 0) == row]


def test_unit_start_sets_the_time_origin(page: str) -> None:
    assert CROSS.duration <= max(_x_ticks(page, "fixed-k3/cross/r0")) <= 70  # a 60 s shape, steps just past it
    shifted = render_report_html(_data(unit_starts={"fixed-k3/cross/r0": START_NS - 100 * 10**9}))
    assert max(_x_ticks(shifted, "fixed-k3/cross/r0")) >= 160  # the steps now start 100 s into the unit
    late = render_report_html(_data(unit_starts={"fixed-k3/cross/r0": START_NS + 30 * 10**9}))
    assert re.search(r"fixed-k3/cross/r0: 6000 steps on 1 engine, shown as \d+ time buckets \(mean k, max batch "
                     r"size\); \d{4} steps before the unit&#x27;s start not shown", late)  # fmt: skip


@pytest.mark.parametrize("shift_s", [None, -100, 30])
def test_timelines_bucketed_by_duckdb_draw_the_same_charts(shift_s: int | None) -> None:
    """The report buckets a run's timelines in DuckDB (they may not fit in memory); the charts are the ones the
    table path draws, unit start shifts and steps before the start included."""
    starts = {} if shift_s is None else {"fixed-k3/cross/r0": START_NS + shift_s * 10**9}
    table = render_report_html(_data(unit_starts=starts))
    series = render_report_html(
        _data(unit_starts=starts, timelines=None, timeline_series=series_of_table(_timelines(), starts))
    )
    section = "<section><h2>Engine timelines"
    assert series[series.index(section) :] == table[table.index(section) :]


def test_empty_run_renders() -> None:
    empty = VerificationReport(arms=[], switch_timings=[], passed=True)
    text = render_report_html(
        _data(maps=[], verification=empty, timelines=None, manifest={}, headline=[], saturated_units=[],
              gate_failures=[])
    )  # fmt: skip
    assert '<span class="badge pass">gates pass</span>' in text and text.count('class="badge') == 1
    assert "No engine timelines in this run." in text and "No arms in the manifest." in text
    assert "<svg" not in text


def test_chromium_loads_the_page(page: str, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not on PATH")
    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    result = subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
         "--enable-logging=stderr", "--v=0", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "specdrill report: demo &amp; test" in result.stdout
    assert "<svg" in result.stdout
    bad = [line for line in result.stderr.splitlines() if "Uncaught" in line or "CONSOLE" in line]
    assert bad == []


def test_a_check_without_evidence_reads_not_verifiable_not_fail() -> None:
    from orchestrator.report.html.verification import verification_section

    unverified = ArmVerification(
        arm="off-ep", kind="off", topology="single", steps=0, match_fraction=None, bands=[], passed=False,
        findings=[Finding.not_verifiable("executed_k", "off-ep", "off-ep: the server reported no drafting steps")],
    )  # fmt: skip
    html = verification_section(VerificationReport(arms=[unverified], switch_timings=[], passed=False))
    assert html.count('<span class="unverified">not verifiable</span>') == 4  # heading, summary row, arm, finding
    assert "FAIL" not in html


def test_steps_without_a_k_are_counted_but_not_drawn() -> None:
    """vLLM reports no k for a step whose drafts no request verified: such a step is not a point at NaN."""
    steps = _timelines()
    k = steps["k"].to_pylist()
    with_gaps = steps.set_column(
        steps.schema.get_field_index("k"), "k",
        pa.array([None if i % 10 == 0 else v for i, v in enumerate(k)], steps.schema.field("k").type),
    )  # fmt: skip
    series = series_of_table(with_gaps, {}, max_points=10**6)  # fixed-k3's 6000 steps drawn one by one
    assert not any(s.bucketed for s in series.values() if s.engines == 1)
    assert all(not np.isnan(s.k).any() for s in series.values())
    assert sum(s.steps for s in series.values()) == steps.num_rows  # counted in the caption all the same
    page = render_report_html(_data(timelines=with_gaps))
    assert "nan" not in page[page.index("<section><h2>Engine timelines") :].lower()


ANSWER = [
    "answer (arms on the same hardware compared on the same requests; ratios > 1 favour the arm first)",
    "by batch size (requests per engine step):",
    "  batch 1-8 (single): fixed-k3 is best: vs off per-token 1.62x [1.51, 1.73] (n=180)",
    "what ran:",
    "  dyn-dp2: ran the static max k = 3: its cells measure what ran, not its policy",
]


def test_the_picture_then_the_answer_come_first() -> None:
    """At a glance (the picture and its sentences), then the answer, above every other section and chart."""
    page = render_report_html(_data(answer=ANSWER))
    assert page.index("<h2>At a glance</h2>") == page.index("<h2>")  # the first section
    glance, answer = page.index("<h2>At a glance</h2>"), page.index('<section class="answer"><h2>Answer</h2>')
    assert glance < page.index("<svg") < answer < page.index("<h2>Operating map 1")
    section = page[answer : page.index("</section>", answer)]
    # without per-band verdicts to tabulate, the answer's sentences are shown as they are
    assert "<li>batch 1-8 (single): fixed-k3 is best: vs off per-token 1.62x [1.51, 1.73] (n=180)</li>" in section
    assert "<li>dyn-dp2: ran the static max k = 3: its cells measure what ran, not its policy</li>" in section


def _heat_titles(page: str) -> dict[str, tuple[str, str]]:
    """Heatmap cell -> (its tooltip, its label), from the first heatmap."""
    elements = list(ET.fromstring(_heatmaps(page)[0]))
    ns = "{http://www.w3.org/2000/svg}"
    found = {}
    for i, element in enumerate(elements):
        title = element.findtext(f"{ns}title") if element.tag == f"{ns}rect" else None
        if title:  # each cell's rect, then (after a hatch, where it did not run as configured) its label
            label = next(e for e in elements[i + 1 :] if e.tag == f"{ns}text")
            found[title.split(":")[0]] = (title, label.text or "")
    return found


def test_the_heatmap_shows_the_ratio_that_decided_each_verdict() -> None:
    """A cell decided by per-engine goodput shows that ratio (not its TPOT speedup), named, and says so."""
    opmap = _map("batch_size")
    goodput = RatioCI(point=0.5, low=0.48, high=0.52, verdict=Verdict.HURTS)
    cells = [
        c.model_copy(update={"speedup": c.speedup.model_copy(update={
            "goodput": goodput, "verdict": Verdict.HURTS, "decided_by": "goodput", "engines_ratio": 2.0})})
        if c.arm == "dyn-dp2" and c.band_index == 0 and c.speedup is not None else c
        for c in opmap.cells
    ]  # fmt: skip
    page = render_report_html(_data(maps=[opmap.model_copy(update={"cells": cells})]))
    titles = _heat_titles(page)
    tip, label = titles["dyn-dp2 @ 1-8"]
    assert label == "goodput/engine 0.50x"
    assert tip.startswith(
        "dyn-dp2 @ 1-8: hurts, decided by goodput: TPOT speedup 1.40x [1.30, 1.50], "
        "goodput ratio per engine 0.50x [0.48, 0.52]; "
    )
    fixed_tip, fixed_label = titles["fixed-k3 @ 1-8"]
    assert fixed_label == "tpot (both) 1.62x" and "decided by both" in fixed_tip
    assert titles["off @ 1-8"][1] == "baseline"


def test_decided_by_is_said_once_per_cell() -> None:
    page = render_report_html(_data())
    cells = re.findall(r'<td class="cell">(.*?)</td>', page, re.S)
    judged = [c for c in cells if "TPOT speedup" in c]
    assert judged and all(c.count("decided by") == 1 for c in judged)
    assert "(decided by both ratios)" in judged[0]
    assert "decided the verdict" not in page


def test_captions_sit_above_their_charts() -> None:
    page = render_report_html(_data())
    figures = re.findall(r"<figure[^>]*>(.*?)</figure>", page, re.S)
    assert len(figures) == page.count('role="img"')
    assert all(f.startswith("<figcaption>") and f.index("</figcaption>") < f.index("<svg") for f in figures)


def test_slo_thresholds_are_shown_with_the_charts_that_use_them() -> None:
    from loadshapes.slo import SloConfig

    page = render_report_html(_data(slo=SloConfig(ttft_s=1.0, tpot_s=0.03)))
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page)
    goodput = [c for c in captions if c.startswith("goodput per band")]
    assert goodput and all("within the SLO (TTFT \u2264 1 s, TPOT \u2264 30 ms)" in c for c in goodput)
    tpot = [c for c in captions if c.startswith("median time per output token")]
    assert tpot and all("dashed red: the SLO&#x27;s TPOT deadline 30 ms" in c for c in tpot)
    charts = [b for b in SVG_BLOCK.findall(page) if 'aria-label="TPOT p50 (ms) by band"' in b]
    assert charts and all('class="slo"' in b and ">SLO TPOT 30 ms</text>" in b for b in charts)
    ns = "{http://www.w3.org/2000/svg}"
    (slo_line,) = [e for e in ET.fromstring(charts[0]).iter(f"{ns}line") if e.get("class") == "slo"]
    # The y axis' tick labels (text-anchor end, 4 px below their tick): the line sits at 30 ms on that scale.
    axis = [(float(t.text or ""), float(t.get("y") or 0) - 4) for t in ET.fromstring(charts[0]).iter(f"{ns}text")
            if t.get("text-anchor") == "end" and (t.text or "").replace(".", "").isdigit()]  # fmt: skip
    (v0, y0), (v1, y1) = axis[0], axis[-1]
    assert v1 >= 30 and abs(float(slo_line.get("y1") or 0) - (y0 + (30 - v0) * (y1 - y0) / (v1 - v0))) < 0.2


def test_coinciding_goodput_lines_are_each_drawn_differently_and_named() -> None:
    """Two arms with the same goodput in every band: their lines lie on one another, so each has its own dash
    and marker, and the caption says they coincide."""
    opmap = _map("batch_size")
    cells = [c.model_copy(update={"goodput_rps": 3.1 * (c.band_index + 1)}) for c in opmap.cells]
    same = opmap.model_copy(update={"cells": cells})
    page = render_report_html(_data(maps=[same]))
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page)
    (goodput,) = [c for c in captions if c.startswith("goodput per band")]
    # dyn-dp2 has no cell in the last band: its line stops there, so it does not lie on theirs
    assert goodput.endswith("; lines coincide: off and fixed-k3 (drawn over one another)")
    chart = next(b for b in SVG_BLOCK.findall(page) if 'aria-label="goodput (req/s) by band"' in b)
    dashes = {p.get("stroke-dasharray") for p in ET.fromstring(chart).iter("{http://www.w3.org/2000/svg}polyline")}
    assert len(dashes) == 3  # one per arm (None: solid), dyn-dp2's line drawn in one piece
    tpot_caption = next(c for c in captions if c.startswith("median time per output token"))
    assert "coincide" not in tpot_caption  # their TPOT differs


def test_not_exercised_reads_as_its_own_status_never_pass() -> None:
    from orchestrator.report.html.verification import verification_section

    arm = ArmVerification(
        arm="dyn", kind="dynamic", topology="single", steps=100, match_fraction=1.0, bands=[], passed=False,
        findings=[
            Finding(check="executed_k", arm="dyn", passed=True, message="dyn: executed k = configured k"),
            Finding.not_exercised("schedule_switched", "dyn", "dyn: not exercised: sizes 1-8 all configure k = 3"),
        ],
    )  # fmt: skip
    timing = SwitchTiming(
        arm="dyn", shape="cross", run="r", repeat=0, reference="shape", crossed_up_s=None, switched_s=None,
        switch_lag_s=None, crossed_down_s=None, recovered_s=None, recovery_s=None, quiet_k=3, loaded_k=None,
        bound_s=10.0, passed=False, status="not_exercised", message="dyn on cross: not exercised: no switch to time",
    )  # fmt: skip
    report = VerificationReport(arms=[arm], switch_timings=[timing], passed=False)
    html = verification_section(report)
    # heading, summary row, arm, finding, timing
    assert html.count('<span class="unverified">not exercised</span>') == 5
    assert "FAIL" not in html and '<span class="ok">pass</span> <b>schedule_switched' not in html
    page = render_report_html(_data(verification=report, gate_failures=[]))
    # The arm ran its k as configured: the words say so, and name what the load did not exercise
    assert "executed k = configured k on 100.0% of steps; schedule_switched not exercised" in page
    assert "<li>dyn: schedule_switched not exercised (no evidence either way)</li>" in page  # at a glance
    assert '<span class="badge pass">gates pass</span>' in page


def test_an_exempt_arms_failure_is_marked_exempt_wherever_it_is_shown() -> None:
    page = render_report_html(
        _data(
            gate_failures=[], exempt_arms=["dyn-dp2"],
            exempt_failures=["dynamic_follows_schedule: dyn-dp2: vLLM dropped the schedule (exempt: reported)"],
        )
    )  # fmt: skip
    exempt = ' <span class="exempt">(exempt)</span>'
    # One badge: the gates' result with the exempt arm whose failure it does not count
    assert page.count('class="badge') == 1
    assert '<span class="badge partial">gates pass; exempt, not counted: dyn-dp2 failed</span>' in page
    assert f'<h3>dyn-dp2 <span class="bad">FAIL</span>{exempt}</h3>' in page
    assert f'<td><span class="bad">FAIL</span>{exempt}</td>' in page  # the summary table's row
    assert "failures on exempt arms (1): reported, they fail no gate" in page
    assert f'<h2>Executed policy <span class="bad">FAIL</span>{exempt}</h2>' in page  # its only failure
    assert page.count(exempt) == 3  # fixed-k3 passed: nothing marked there
    assert "<li>dyn-dp2 (exempt) did not run as configured (schedule_dropped failed)" in page


# -- at a glance: the picture, its shading and marks ---------------------------------------------------------------


def _band_answer(band: int, status: str, best: list[str], requests: int = 200) -> BandAnswer:
    label = _map("batch_size").bands[band].label
    return BandAnswer(
        measure="batch_size", band=label, band_index=band, hardware="single", status=status, best=best,  # type: ignore[arg-type]
        requests=requests, message=f"batch {label} (single): {status}",
    )  # fmt: skip


# By hand from SPEEDUPS (fixed-k3 helps, no difference, hurts over the three bands): what the answer says there.
ANSWER_BANDS = [
    _band_answer(0, "best", ["fixed-k3"]),
    _band_answer(1, "no_difference", ["off", "fixed-k3"]),
    _band_answer(2, "plain_decoding", ["off"]),
]


def _overview(page: str) -> ET.Element:
    (block,) = (b for b in SVG_BLOCK.findall(page) if 'aria-label="speedup against load' in b)
    return ET.fromstring(block)


def test_the_picture_shades_where_speculation_should_be_off_and_says_so() -> None:
    page = render_report_html(_data(maps=[_map("batch_size")], answer_bands=ANSWER_BANDS, answer=ANSWER))
    ns = "{http://www.w3.org/2000/svg}"
    svg = _overview(page)
    shaded = [r for r in svg.iter(f"{ns}rect") if r.get("class") == "off-band"]
    labels = {t.text: float(t.get("x") or 0) for t in svg.iter(f"{ns}text")}
    spans = [(float(r.get("x") or 0), float(r.get("x") or 0) + float(r.get("width") or 0)) for r in shaded]
    # the two bands where no arm beats plain decoding, and only those, lie under the shading
    assert sorted(b for b in ("1-8", "9-64", "65-256") if any(lo < labels[b] < hi for lo, hi in spans)) == [
        "65-256", "9-64"
    ]
    assert (
        "<li>by batch size: speculation should be off here: 9-64 (no arm beats plain decoding); 65-256 (plain "
        "decoding is best)</li>"
    ) in page
    table = page[page.index('<table class="answer">') :]
    assert '<span class="v v-hurts">plain decoding</span>: speculation off' in table[: table.index("</table>")]


def test_no_shading_and_no_advice_from_too_few_data() -> None:
    thin = [_band_answer(i, "insufficient_data", [], requests=5) for i in range(3)]
    page = render_report_html(_data(maps=[_map("batch_size")], answer_bands=thin))
    assert not [r for r in _overview(page).iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "off-band"]
    assert "by batch size: no band has a verdict against plain decoding" in page
    assert "speculation should be off here" not in page and "should be off nowhere" not in page
    helped = [ANSWER_BANDS[0], *thin[1:]]
    page = render_report_html(_data(maps=[_map("batch_size")], answer_bands=helped))
    assert (
        "<li>by batch size: no band calls for speculation off: an arm beats plain decoding in every band except "
        "9-64; 65-256, which have no verdict against plain decoding</li>"
    ) in page


def test_an_arm_that_did_not_run_as_configured_is_hollow_and_hatched() -> None:
    """dyn-dp2 failed schedule_dropped (the fixture's verification): hollow in the picture, hatched with a mark in
    every heatmap; fixed-k3 ran as configured: filled, no hatch."""
    page = render_report_html(_data())
    ns = "{http://www.w3.org/2000/svg}"
    circles = [(c.findtext(f"{ns}title") or "", c.get("fill")) for c in _overview(page).iter(f"{ns}circle")]
    assert {fill for tip, fill in circles if tip.startswith("dyn-dp2")} == {"#fff"}
    assert all(tip.endswith("(did not run as configured)") for tip, _ in circles if tip.startswith("dyn-dp2"))
    assert "#fff" not in {fill for tip, fill in circles if tip.startswith("fixed-k3")}
    for heatmap in _heatmaps(page):
        root = ET.fromstring(heatmap)
        hatched = [r for r in root.iter(f"{ns}rect") if r.get("class") == "not-as-configured"]
        assert len(hatched) == 3  # one per band of dyn-dp2's column
        heads = {t.text for t in root.iter(f"{ns}text")}
        assert "dyn-dp2 \u26a0" in heads and "fixed-k3" in heads
    assert "hollow: did not run as configured (schedule_dropped)" in page


def test_a_comparison_on_other_hardware_is_marked_everywhere() -> None:
    maps = [
        m.model_copy(update={"cells": [
            c.model_copy(update={"speedup": c.speedup.model_copy(update={"engines_ratio": 2.0})})
            if c.arm == "dyn-dp2" and c.speedup is not None else c for c in m.cells]})
        for m in (_map("batch_size"), _map("offered_rate"))
    ]  # fmt: skip
    page = render_report_html(_data(maps=maps))
    assert "dyn-dp2 is compared per engine with off: not on equal hardware" in page
    assert "per engine: not on equal hardware" in page  # the picture's legend
    for heatmap in _heatmaps(page):
        assert "dyn-dp2 \u26a0 \u2260</text>" in heatmap and "fixed-k3</text>" in heatmap


def test_timelines_are_charted_only_where_k_varies() -> None:
    steps = _timelines()
    flat = pa.table({
        "arm": ["off"] * 50, "shape": ["cross"] * 50, "repeat": [0] * 50, "engine_id": ["off-e0"] * 50,
        "start_ns": [START_NS + i * 10**9 for i in range(50)],
        "end_ns": [START_NS + i * 10**9 + 10**7 for i in range(50)],
        **{c: pa.array([0 if c == "k" else 4] * 50, pa.int32())
           for c in ("batch_size", "k", "drafted", "accepted", "waiting", "num_prefill")},
    }).cast(steps.schema)  # fmt: skip
    page = render_report_html(_data(timelines=pa.concat_tables([steps, flat])))
    section = page[page.index("<h2>Engine timelines") :]
    assert "<li>off: executed k = 0 throughout cross/r0 (50 steps)</li>" in section
    assert "time: off/cross/r0" not in section  # no chart of a flat line
    assert "time: fixed-k3/cross/r0" in section and "time: dyn-dp2/cross/r0" in section  # their k varies


def test_no_negative_zero_is_printed() -> None:
    from orchestrator.analysis.steps.kswitch import KSwitch, describe
    from orchestrator.numfmt import fixed, signed

    assert (fixed(-0.0004, 3), signed(-0.0004, 3), signed(0.0004, 3)) == ("0.000", "0.000", "0.000")
    assert (fixed(-0.0006, 3), signed(-0.0006, 3), signed(0.0006, 3)) == ("-0.001", "-0.001", "+0.001")
    # the simulated engine's k-switch cost: tens of nanoseconds either side of zero
    line = describe(KSwitch(switches=90, excess_s=-1.8e-8, low_s=-4.0e-8, high_s=3.0e-9))
    assert line == "k-switch cost 0.000 ms per switch [0.000, 0.000] over 90 switches"
    timing = _verification().switch_timings[0].model_copy(update={"switch_lag_s": -1e-9, "recovery_s": -0.004})
    page = render_report_html(_data(verification=_verification().model_copy(update={"switch_timings": [timing]})))
    assert not re.search(r"-0(\.0+)?(?![.\d])", re.sub(r"<[^>]+>", " ", page)), "a negative zero is printed"


# -- in a browser: the page's height and width at a 1280 px window -------------------------------------------------

MEASURE = """<script>
addEventListener("load", () => {
  const page = document.documentElement;
  const tables = [...document.querySelectorAll("table")].map(t => [t.scrollWidth, t.parentElement.clientWidth]);
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify({height: page.scrollHeight, width: page.scrollWidth, tables});
  document.body.appendChild(out);
});
</script>"""


def _measured(page: str, tmp_path: Path) -> dict[str, object]:
    """The page laid out by headless Chromium in a 1280 x 900 window: its height, its width, and each table's
    width beside its container's (a script is added to this copy only: report.html itself has none)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not on PATH")
    path = tmp_path / "measured.html"
    path.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    result = subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
         "--window-size=1280,900", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    found = re.search(r'<pre id="measured">(.*?)</pre>', result.stdout)
    assert found, result.stdout[-2000:]
    return dict(json.loads(html.unescape(found.group(1))))


@pytest.fixture(scope="module")
def quickstart_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """report.html of campaigns/quickstart.yaml run in virtual time (seconds): five arms, three shapes."""
    run = tmp_path_factory.mktemp("quickstart") / "run"
    result = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "simulate", "campaigns/quickstart.yaml",
         "--output", str(run)],
        capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return (run / "report.html").read_text(encoding="utf-8")


def _fits(measured: dict[str, object]) -> None:
    assert isinstance(measured["width"], int) and measured["width"] <= 1280, measured
    tables = measured["tables"]
    assert isinstance(tables, list) and tables
    assert [t for t in tables if t[0] > t[1]] == [], "a table is wider than its container"


def test_the_quickstart_report_answers_in_one_screenful_and_nothing_overflows(
    quickstart_page: str, tmp_path: Path
) -> None:
    """The quickstart's page at 1280 px: under 5000 px tall (it was 13,348 px with a chart per unit and every
    table open), no horizontal scroll, every table within its container."""
    measured = _measured(quickstart_page, tmp_path)
    _fits(measured)
    assert isinstance(measured["height"], int) and measured["height"] < 5000, measured
    page = quickstart_page
    assert page.count('class="badge') == 1
    assert '<span class="badge partial">gates pass; exempt, not counted: dyn-dp2 failed</span>' in page
    # the exempt gate is named once and points at its evidence; its findings are said in that section only
    assert "<li>dynamic_follows_schedule on dyn-dp2 (exempt): see Executed policy</li>" in page
    assert page.count("the schedule never switched: executed k = 3 in all") == 1
    top = page[: page.index("<h2>Answer</h2>")]  # the picture and its sentences, before anything else
    # where speculation should be off, said per map (the quickstart's arms beat plain decoding wherever judged)
    assert re.search(r"<li>by offered rate: [^<]*speculation[^<]* off", top)
    assert re.search(r"<li>by batch size: [^<]*speculation[^<]* off", top)
    assert "dyn-dp2 (exempt) did not run as configured" in top
    # the units whose k never changes are a line each, not a flat chart: dyn-single's ramp and cross switch k
    section = page[page.index("<h2>Engine timelines") :]
    assert "<li>off-single: executed k = 0 throughout" in section and "time: off-single/" not in section
    assert "time: dyn-single/cross/r0" in section


def test_the_hand_built_page_fits_a_1280_px_window(page: str, tmp_path: Path) -> None:
    _fits(_measured(page, tmp_path))


def test_without_a_speedup_there_is_no_picture_and_no_advice() -> None:
    """Absolute figures only (no `off` arm): no cell has a speedup, so no picture and no sentence on speculation."""
    maps = [
        m.model_copy(update={"cells": [c.model_copy(update={"speedup": None}) for c in m.cells]})
        for m in (_map("batch_size"), _map("offered_rate"))
    ]
    page = render_report_html(_data(maps=maps, headline=["no off arm: absolute figures only"]))
    assert "<h2>At a glance</h2>" not in page and "speedup against load" not in page
    assert "speculation should" not in page and "calls for speculation" not in page
    assert "<b>Note:</b> no off arm: absolute figures only</div>" in page


def test_the_console_map_names_a_comparison_not_on_equal_hardware() -> None:
    import io

    from rich.console import Console

    from orchestrator.report.build import map_table

    opmap = _map("batch_size")
    cells = [
        c.model_copy(update={"speedup": c.speedup.model_copy(update={"engines_ratio": 2.0})})
        if c.arm == "dyn-dp2" and c.speedup is not None else c
        for c in opmap.cells
    ]  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=250, color_system=None).print(map_table(opmap.model_copy(update={"cells": cells})))
    text = out.getvalue()
    assert "(per engine vs off: not equal hardware)" in text and text.count("not equal hardware") == 1
