"""The prediction check: the run's campaign replayed in virtual time on the fitted profile (the same traffic: the
same shapes, mix and seed), and per arm and offered-rate band the measured against the predicted per-token
latency p50 / p90 and E2E p50 (DuckDB quantiles over ok requests), and each fixed-k arm's TPOT p50 speedup against
its topology's `off` arm, measured and predicted, in points."""

from __future__ import annotations

import tempfile
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from orchestrator.analysis.opmap.bands import BandSet, auto_rate_bands, rate_bands_from_edges
from orchestrator.analysis.read.inputs import RunInputs, load_run
from orchestrator.analysis.read.time_scale import engine_time_scale
from orchestrator.analysis.read.views import run_requests
from orchestrator.plan.campaign import Campaign
from orchestrator.virtual.campaign import simulate_campaign
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.engine_kinds.simulated import SimulatedEngineConfig
from serve_apps.policies import FixedPolicy, OffPolicy

MEASURES = ("tpot_p50", "tpot_p90", "e2e_p50")
ALL = "all"  # the band label of an arm's requests at every offered rate
BAND_COUNT = 3  # automatic bands (no analysis.rate_bands): few, so each holds enough requests for a p90
_QUANTILES = "quantile_cont(tpot, 0.5), quantile_cont(tpot, 0.9), quantile_cont(e2e, 0.5), count(*)"

Quantiles = dict[tuple[str, str], dict[str, float]]  # (arm, band label) -> measure -> seconds


@dataclass(frozen=True)
class Cell:
    arm: str
    band: str
    requests: int  # measured ok requests in the cell
    measured: dict[str, float]
    predicted: dict[str, float]

    def ratio(self, measure: str) -> float:
        return self.predicted[measure] / self.measured[measure]


@dataclass(frozen=True)
class Speedup:
    arm: str
    baseline: str
    band: str
    measured: float  # off TPOT p50 / arm TPOT p50 - 1
    predicted: float

    @property
    def points(self) -> float:
        return 100.0 * (self.predicted - self.measured)


@dataclass(frozen=True)
class PredictionCheck:
    run: str
    repeats: tuple[int, ...]  # the repeats compared (the held-out ones where the fit left some out)
    held_out: bool
    bands: BandSet
    cells: list[Cell]
    speedups: list[Speedup]

    def lines(self) -> list[str]:
        which = "held-out" if self.held_out else "fitted (in-sample: no repeat was held out)"
        repeats = ", ".join(f"r{r}" for r in self.repeats)
        out = [f"prediction check, {self.run}, {which} repeats {repeats}, replayed in virtual time: predicted/measured"]
        for c in self.cells:
            ratios = ", ".join(f"{m.replace('_', ' ')} {c.ratio(m):.3f}" for m in MEASURES)
            out.append(f"  arm {c.arm}, {offered(c.band)} ({c.requests} requests): {ratios}")
        for s in self.speedups:
            out.append(
                f"  arm {s.arm} vs {s.baseline}, {offered(s.band)}: TPOT p50 speedup measured {s.measured:+.1%},"
                f" predicted {s.predicted:+.1%} ({s.points:+.1f} points)"
            )
        return out


def offered(band: str) -> str:
    return "every offered rate" if band == ALL else f"offered {band} req/s"


def replay_engine(campaign: Campaign, profile_path: str) -> SimulatedEngineConfig:
    """The run's engine as the fitted profile: its seed, its max_model_len and, for a simulated engine, its
    time_scale (the profile is in the hardware's own seconds; the run's wall seconds are scaled)."""
    engine = campaign.engine
    seed = getattr(engine, "seed", 0)
    scale = engine_time_scale(campaign)
    max_model_len = kind_of(engine).max_model_len(engine)
    if max_model_len is not None:
        return SimulatedEngineConfig(profile=profile_path, seed=seed, max_model_len=max_model_len, time_scale=scale)
    return SimulatedEngineConfig(profile=profile_path, seed=seed, time_scale=scale)


def _units(inputs: RunInputs, repeats: Collection[int]) -> list[tuple[str, str, int]]:
    return [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units if u.unit.repeat in repeats]


def check_bands(inputs: RunInputs, repeats: Collection[int]) -> BandSet:
    edges = inputs.campaign.analysis.rate_bands
    if edges is not None:
        return rate_bands_from_edges(edges)
    requests = run_requests(inputs.store.root, _units(inputs, repeats))
    try:
        rates = requests.con.execute("SELECT offered_rate FROM requests WHERE ok").fetchnumpy()["offered_rate"]
    finally:
        requests.close()
    return auto_rate_bands(np.asarray(rates, dtype=float), count=BAND_COUNT)


def arm_quantiles(
    inputs: RunInputs, bands: BandSet, repeats: Collection[int]
) -> tuple[Quantiles, dict[tuple[str, str], int]]:
    """Per (arm, band) and (arm, ALL) the measures, and the ok requests counted in each."""
    band = bands.sql("offered_rate")
    sql = f"""
    SELECT arm, {band} AS band, {_QUANTILES} FROM requests WHERE ok GROUP BY arm, band
    UNION ALL SELECT arm, -2 AS band, {_QUANTILES} FROM requests WHERE ok GROUP BY arm
    """
    requests = run_requests(inputs.store.root, _units(inputs, repeats))
    try:
        rows = requests.con.execute(sql).fetchall()
    finally:
        requests.close()
    labels = {i: b.label for i, b in enumerate(bands.bands)} | {-2: ALL}
    out: Quantiles = {}
    counts: dict[tuple[str, str], int] = {}
    for arm, code, *values, n in rows:
        if code not in labels or None in values:
            continue
        key = (str(arm), labels[code])
        out[key] = dict(zip(MEASURES, map(float, values), strict=True))
        counts[key] = int(n)
    return out, counts


def speedups(campaign: Campaign, measured: Quantiles, predicted: Quantiles) -> list[Speedup]:
    arms = campaign.arms()
    off = {a.topology.model_dump_json(): a.name for a in arms if isinstance(a.policy, OffPolicy)}
    out = []
    for arm in arms:
        baseline = off.get(arm.topology.model_dump_json())
        if not isinstance(arm.policy, FixedPolicy) or baseline is None:
            continue
        for (name, band), m in sorted(measured.items()):
            keys = ((name, band), (baseline, band))
            if name != arm.name or not all(k in predicted and k in measured for k in keys):
                continue
            base_m, base_p = measured[(baseline, band)]["tpot_p50"], predicted[(baseline, band)]["tpot_p50"]
            p = predicted[(name, band)]
            out.append(Speedup(name, baseline, band, base_m / m["tpot_p50"] - 1.0, base_p / p["tpot_p50"] - 1.0))
    return out


def predict(inputs: RunInputs, profile_path: str, *, fitted_repeats: Collection[int] | None = None) -> PredictionCheck:
    """Replays the run on the profile; compares the repeats the fit left out, or all of them where it left none."""
    every = sorted({u.unit.repeat for u in inputs.units})
    held = [r for r in every if fitted_repeats is not None and r not in fitted_repeats]
    compared = held or every
    campaign = inputs.campaign.model_copy(update={"engine": replay_engine(inputs.campaign, profile_path)})
    bands = check_bands(inputs, compared)
    measured, counts = arm_quantiles(inputs, bands, compared)
    with tempfile.TemporaryDirectory(prefix="specdrill-calibrate-") as out:
        simulate_campaign(campaign, output=out)
        predicted, _ = arm_quantiles(load_run(out), bands, compared)
    order = {b.label: i for i, b in enumerate(bands.bands)} | {ALL: len(bands.bands)}
    cells = [
        Cell(arm, band, counts[(arm, band)], measured[(arm, band)], predicted[(arm, band)])
        for arm, band in sorted(measured, key=lambda k: (k[0], order[k[1]]))
        if (arm, band) in predicted
    ]
    return PredictionCheck(
        run=str(inputs.manifest["run"]),
        repeats=tuple(compared),
        held_out=bool(held),
        bands=bands,
        cells=cells,
        speedups=speedups(inputs.campaign, measured, predicted),
    )
