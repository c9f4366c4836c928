"""Automatic offered-rate bands separate quiet from peak (issue 40: the shipped GPU campaign's bands put its 1 req/s
quiet phase and its 40 req/s busy hold in one band, "0-40"). The traffic here is built from shapes whose phases
are known, so which rates are quiet and which are the peak is known before any band is cut."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from loadshapes.shapes import CrossAndRecover, Quiet, Ramp, ShapeBase, Sustained
from orchestrator.analysis.opmap.bands import BandSet, auto_rate_bands, rate_bands_from_edges
from orchestrator.analysis.read.source import request_frame
from orchestrator.analysis.summary import offered_rate_bands
from tests.hub_cache import offline_sharegpt
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table

# The shipped GPU campaign's shapes before issue 40 (campaigns/gpu-llama3.1-8b-eagle.yaml at 6227d97)
GPU_BEFORE: dict[str, ShapeBase] = {
    "quiet": Quiet(rate=1, duration_s=300),
    "ramp": Ramp(rate_from=1, rate_to=60, duration_s=600),
    "busy": Sustained(rate=40, duration_s=600),
    "cross": CrossAndRecover(quiet_rate=2, peak_rate=60, boundary_rate=30, quiet_s=120, rise_s=120, hold_s=300,
                             fall_s=120),
}  # fmt: skip


def _offered(shapes: dict[str, ShapeBase]) -> np.ndarray:
    """The rate each request is offered at, request i arriving where the shape's integral reaches i + 1/2 (no
    randomness: the counts are the shapes' own integrals)."""
    rates = []
    for shape in shapes.values():
        grid = np.linspace(0, shape.duration, int(shape.duration * 100) + 1)
        arrived = shape.cumulative(grid)
        times = np.interp(np.arange(0.5, arrived[-1]), arrived, grid)
        rates.append(shape.rate_at(times))
    return np.concatenate(rates)


def _band_of(bands: BandSet, rate: float) -> int:
    return int(bands.assign(np.array([rate]))[0])


def test_quiet_and_peak_never_share_a_band() -> None:
    # The report's five bands (summary.offered_rate_bands); the quiet phases are a quarter of the campaign's time
    rates = _offered(GPU_BEFORE)
    bands = auto_rate_bands(rates)
    quiet = {_band_of(bands, r) for r in (1.0, 2.0)}  # both quiet phases' rates
    # One band holds the quiet phases, and nothing the campaign offers at 3x their rate or more
    assert len(quiet) == 1, [b.label for b in bands.bands]
    (q,) = quiet
    assert bands.bands[q].upper < 6, [b.label for b in bands.bands]
    assert _band_of(bands, 40.0) != q and _band_of(bands, 60.0) != q
    # Every band holds some of the traffic (no edge on the quiet rate itself leaves an empty band below it)
    codes = bands.assign(rates)
    assert set(codes.tolist()) == set(range(len(bands.bands)))


def test_the_report_cuts_the_same_bands_from_its_sql_quantiles() -> None:
    # summary.offered_rate_bands reads the quantiles in DuckDB; tune and calibrate call auto_rate_bands on arrays
    rates = _offered(GPU_BEFORE)
    n = len(rates)
    table = trace_table(arm=["off"] * n, scheduled_ns=START_NS + np.arange(n) * 10**6)
    requests = request_frame(table, offered_rate=rates)
    try:
        from_sql = offered_rate_bands(requests)
    finally:
        requests.close()
    assert from_sql is not None
    assert [b.label for b in from_sql.bands] == [b.label for b in auto_rate_bands(rates).bands]


def test_a_campaign_without_quiet_keeps_the_request_quantiles() -> None:
    # Sustained at one rate only: nothing quiet to separate, one edge at that rate, as before
    assert [b.label for b in auto_rate_bands(_offered({"busy": Sustained(rate=20, duration_s=60)})).bands] == [
        "0-20",
        "20+",
    ]
    assert math.isinf(auto_rate_bands(np.full(10, 5.0)).bands[-1].upper)


def test_the_shipped_gpu_campaign_separates_quiet_from_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.plan.campaign import load_campaign

    offline_sharegpt(monkeypatch, tmp_path)  # its ShareGPT data set, as the Hub cache holds it once fetched
    campaign = load_campaign(str(Path(__file__).parents[3] / "campaigns" / "gpu-llama3.1-8b-eagle.yaml"))
    rates = _offered(dict(campaign.shapes))
    edges = campaign.analysis.rate_bands
    bands = auto_rate_bands(rates) if edges is None else rate_bands_from_edges(edges)
    quiet = min(float(s.rate_at(0)) for s in campaign.shapes.values())
    peak = float(rates.max())
    assert _band_of(bands, quiet) != _band_of(bands, peak)
    assert bands.bands[_band_of(bands, quiet)].upper <= 3 * quiet, [b.label for b in bands.bands]
