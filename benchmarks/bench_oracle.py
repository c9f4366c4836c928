"""The analysis against the simulator's ground truth on larger runs than
tests/orchestrator/decide/test_ground_truth.py (issue 15).

1. `off` and fixed k = 1..4 over a ramp: the recommended schedule (`specdrill recommend`) against the oracle's
   best k at every batch size the campaign covered (exact, tied within the margin, one band of slack, or miss).
2. The recommended campaign rehearsed in virtual time: per offered-rate band, each fixed arm's per-token latency
   over the recommended arm's on the same requests (> 1: the recommendation is faster), with intervals.
3. The report's crossover for fixed k = 3 against `off` against a dense open-loop sweep of the same traffic.

Profiles: the tests' costly-verify profile (crossovers at a few to ~25 req/s) and, for 1 and 2, the shipped
H100 EAGLE profile (k = 4, 3, 2 across batch 1-128; no crossover for k = 3 at loads a run reaches).
Figures are in docs/engineering/grading.md. `make bench-oracle`; --quick for the tests' sizes.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.decide.ground_truth import (
    FIXED_ARMS,
    SHIPPED_EAGLE,
    costly_verify_profile,
    crossover_campaign,
    fixed_k_campaign,
    rehearsal_vs_fixed,
    report_crossover,
    schedule_agreement,
    short_chat,
    sweep_crossover,
)
from orchestrator.decide.oracle import oracle
from orchestrator.decide.recommend.recommendation import Recommendation
from orchestrator.plan.campaign import Campaign, load_campaign
from orchestrator.report.build import write_report
from orchestrator.virtual.campaign import simulate_campaign
from serve_apps.sim.profile import load_profile

MARGIN = MapSettings().margin


def _ratio(r: object) -> str:
    point, low, high = (getattr(r, n) for n in ("point", "low", "high"))
    if point is None:
        return "n/a"
    return f"{point:.3f}" + (f" [{low:.3f},{high:.3f}]" if low is not None and high is not None else "")


def schedule_and_rehearsal(
    name: str, profile_path: Path, root: Path, *, rate_to: float, duration_s: float, sizes: tuple[int, ...]
) -> None:
    print(f"\n== {name}: off + fixed k=1..4 over a ramp 1 -> {rate_to:g} req/s in {duration_s:g} s ==")
    t0 = time.perf_counter()
    campaign = Campaign.model_validate(
        fixed_k_campaign(profile_path, root / f"{name}-run", rate_to=rate_to, duration_s=duration_s)
    )
    store, _ = simulate_campaign(campaign)
    write_report(store.root)
    subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "recommend", store.root],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    recommendation = Recommendation.model_validate_json((Path(store.root) / "recommendation.json").read_text())
    truth = oracle(load_profile(str(profile_path)), workload=short_chat(), max_k=4, batch_sizes=sizes, tolerance=MARGIN)
    print(f"campaign, report, recommend and oracle: {time.perf_counter() - t0:.0f} s wall")
    print(f"recommended schedule: {recommendation.schedule}  oracle's: {truth.schedule()}")
    print("1. batch  band      recommended  oracle best  ties (within the margin)  agreement")
    rows = schedule_agreement(truth, recommendation)
    for r in rows:
        ties = ",".join(map(str, r.near_best))
        print(f"   {r.batch_size:5d}  {r.band:8s}  k={r.recommended_k:<10d} k={r.oracle_k:<10d} {ties:24s}  {r.match}")
    counts = {m: sum(r.match == m for r in rows) for m in ("exact", "slack", "miss")}
    print(f"   {counts['exact']} exact, {counts['slack']} within one band, {counts['miss']} missed of {len(rows)}")
    uncovered = [b.band for b in recommendation.bands if b.k is None]
    if uncovered:
        print(f"   not covered (no k chosen): {', '.join(uncovered)}")

    t0 = time.perf_counter()
    rehearsal = load_campaign(Path(store.root) / "recommended-campaign.yaml")
    rehearsed, _ = simulate_campaign(rehearsal)
    _, bands = rehearsal_vs_fixed(rehearsed.root, "recommended-single", FIXED_ARMS)
    print(f"2. rehearsal ({time.perf_counter() - t0:.0f} s wall): fixed arm's per-token latency over the "
          "recommended arm's, same requests (> 1: recommended faster)")  # fmt: skip
    for band in bands:
        cells = "  ".join(f"k{a[5]} {_ratio(v)}" for a, v in band.fixed_over_recommended.items())
        verdict = "no worse than best" if band.no_worse_than_best(MARGIN) else "WORSE than best"
        beats = ",".join(a[:6] for a in band.better_than(MARGIN)) or "-"
        best = band.best_fixed[:6] if band.best_fixed else "-"
        print(f"   {band.band:8s} best {best}: {verdict}; beats {beats}\n      {cells}")


def crossover(profile_path: Path, root: Path, *, rates: list[float], duration_s: float, sweep_step: float,
              sweep_duration_s: float) -> None:  # fmt: skip
    print(f"\n== crossover of fixed k=3 against off: sustained {rates[0]:g}..{rates[-1]:g} req/s, "
          f"{duration_s:g} s each; sweep every {sweep_step:g} req/s, {sweep_duration_s:g} s each ==")  # fmt: skip
    t0 = time.perf_counter()
    data = crossover_campaign(profile_path, root / "crossover", rates=rates, duration_s=duration_s)
    store, _ = simulate_campaign(Campaign.model_validate(data))
    summary = write_report(store.root)
    rate_map = next(m for m in summary.maps if m.measure == "offered_rate")
    band = report_crossover(rate_map, "fixed3-single")
    dense = sweep_crossover(
        load_profile(str(profile_path)), 3, workload=short_chat(),
        rates=np.arange(rates[0], rates[-1] + 1e-9, sweep_step).tolist(), duration=sweep_duration_s,
    )  # fmt: skip
    print(f"{time.perf_counter() - t0:.0f} s wall")
    for cell in rate_map.cells:
        if cell.arm == "fixed3-single" and cell.speedup is not None:
            said = f"{_ratio(cell.speedup.tpot)} {cell.speedup.verdict.value}"
            print(f"   report band {cell.band:8s} per-token speedup {said}")
    print("   sweep: " + ", ".join(f"{r:g}: {s:.3f}" for r, s in zip(dense.rates, dense.speedups, strict=True)))
    crossing_1 = next((r for r, s in zip(dense.rates, dense.speedups, strict=True) if s <= 1.0), None)
    print(f"3. report: stops helping in band {band}; sweep: speedup falls to {dense.threshold:g} at "
          f"{dense.crossover} req/s (first rate at or below 1.0: {crossing_1})")  # fmt: skip
    if band is not None and dense.crossover is not None:
        print(f"   report's crossover (band's low edge) off by {abs(band[0] - dense.crossover) / dense.crossover:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tests' sizes")
    parser.add_argument("--skip-eagle", action="store_true", help="only the costly-verify profile")
    args = parser.parse_args()
    print(f"bench_oracle on {platform.node()} ({platform.processor() or platform.machine()}), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-oracle-") as tmp:
        root = Path(tmp)
        costly = root / "costly.yaml"
        costly.write_text(yaml.safe_dump(costly_verify_profile()))
        sizes = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 96)
        schedule_and_rehearsal(
            "costly-verify", costly, root, rate_to=27, duration_s=90 if args.quick else 360, sizes=sizes
        )
        if not args.skip_eagle:
            schedule_and_rehearsal(
                "eagle", SHIPPED_EAGLE, root, rate_to=150, duration_s=60 if args.quick else 180,
                sizes=(*sizes, 128, 192),
            )  # fmt: skip
        crossover(
            costly, root,
            rates=[float(r) for r in (range(16, 31, 2) if args.quick else range(16, 31))],
            duration_s=40 if args.quick else 120,
            sweep_step=0.5 if args.quick else 0.25,
            sweep_duration_s=60 if args.quick else 240,
        )  # fmt: skip


if __name__ == "__main__":
    main()
