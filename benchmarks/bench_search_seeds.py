"""`specdrill search` across traffic seeds (issue 40): on the README's `first.yaml`, `--arm dyn-single`, does the
bracket the search reports contain the crossover of a dense sweep, seed after seed?

The reference is computed apart from the search's code: `specdrill simulate` runs, one per sweep seed, each a
campaign of one 150-request `sustained` unit (the search's own unit length) at each of a dense grid of rates,
the rate bands cut between them, each rate's deciding ratio read from summary.json. Each seed's units are one
traffic sample per rate; the reference ratio at a rate is the geometric mean over the sweep's seeds, and its
crossover the first crossing of 1 of those means (linear in log rate between neighbours), refined by a straight
line through every sample's log ratio within 15% of it. Its precision: the same root over the sweep's seeds
resampled (bootstrap, 2000 draws). The sweep's seeds (1000 on) are not the search's (0 on).

Then `specdrill search first.yaml --arm dyn-single` for each search seed (the campaign's `seed`), and per seed:
its outcome, bracket, the samples each end rests on, units and requests. The claim: the bracket contains the
reference crossover in at least 9 of 10 seeds. `make bench-search` runs it after bench_search.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
UNIT_REQUESTS = 150


def first_yaml() -> dict[str, Any]:
    found = re.search(r"```yaml\n(name: first\n.*?)```", (ROOT / "README.md").read_text(), re.S)
    if not found:
        sys.exit("README.md has no `name: first` campaign block")
    data: dict[str, Any] = yaml.safe_load(found.group(1))
    return data


def cli(*args: str) -> None:
    specdrill = Path(sys.executable).with_name("specdrill")  # the venv's entry point, as an operator runs it
    done = subprocess.run([str(specdrill), *args], capture_output=True, text=True)
    if done.returncode not in (0, 3):  # 3: a gate failed, the numbers stand
        sys.exit(f"specdrill {' '.join(args)}: exit {done.returncode}\n{done.stderr[-2000:]}")


def sweep_seed(root: Path, seed: int, rates: list[float]) -> list[float]:
    """One traffic sample per rate: the deciding ratio of dyn-single against off-single at each rate."""
    data = first_yaml()
    data.update(
        seed=seed, gates={}, repeats=1, output=str(root / f"sweep-{seed}"),
        arms=[{"policy": "off", "topology": "single"}, {"policy": "dyn", "topology": "single"}],
        shapes={f"r{i:02d}": {"kind": "sustained", "rate": rate, "duration_s": UNIT_REQUESTS / rate}
                for i, rate in enumerate(rates)},
        analysis={"rate_bands": [0.0, *(math.sqrt(a * b) for a, b in itertools.pairwise(rates))]},
    )  # fmt: skip
    path = root / f"sweep-{seed}.yaml"
    path.write_text(yaml.safe_dump(data))
    cli("simulate", str(path))
    summary = json.loads((root / f"sweep-{seed}" / "summary.json").read_text())
    rate_map = next(m for m in summary["maps"] if m["measure"] == "offered_rate")
    ratios = [math.nan] * len(rates)
    for cell in rate_map["cells"]:
        if cell["arm"] == "dyn-single" and cell["speedup"] is not None:
            speedup = cell["speedup"]
            ratio = speedup["goodput"] if speedup["decided_by"] == "goodput" else speedup["tpot"]
            ratios[cell["band_index"]] = ratio["point"]
    return ratios


def root_of(rates: np.ndarray, logs: np.ndarray) -> float | None:
    """Where the mean log ratio crosses 0 going up in rate: a cubic in log rate fitted to every sample (the
    per-rate means alone wander by their samples' spread), its first falling root inside the grid; None where
    it has none."""
    x = np.repeat(np.log(rates)[None, :], logs.shape[0], axis=0).ravel()
    y = logs.ravel()
    keep = np.isfinite(y)
    fit = np.polynomial.Polynomial.fit(x[keep], y[keep], 3)
    slope = fit.deriv()
    lowest, highest = math.log(float(rates[0])), math.log(float(rates[-1]))
    real = [float(r.real) for r in fit.roots() if abs(r.imag) < 1e-9]
    roots = sorted(r for r in real if lowest <= r <= highest and slope(r) < 0)
    return math.exp(roots[0]) if roots else None


def first_crossing(rates: list[float], logs: np.ndarray) -> float | None:
    """The per-rate means' first crossing of 0 (linear in log rate between neighbours), shown beside the fit."""
    means = np.nanmean(logs, axis=0)
    for i in range(len(means) - 1):
        if means[i] >= 0 > means[i + 1]:
            a, b = math.log(rates[i]), math.log(rates[i + 1])
            return math.exp(a + means[i] / (means[i] - means[i + 1]) * (b - a))
    return None


def search_seed(root: Path, seed: int) -> dict[str, Any]:
    data = first_yaml()
    data["seed"] = seed
    path = root / f"first-{seed}.yaml"
    path.write_text(yaml.safe_dump(data))
    out = root / f"search-{seed}"
    began = time.perf_counter()
    cli("search", str(path), "--arm", "dyn-single", "-o", str(out))
    record: dict[str, Any] = json.loads((out / "search.json").read_text())
    record["seconds"] = time.perf_counter() - began
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="search seeds")
    parser.add_argument("--sweep-seeds", type=int, default=16, help="traffic samples per rate in the sweep")
    parser.add_argument("--sweep-file", type=Path, default=None,
                        help="keep the sweep's per-sample ratios here (JSON) and reuse them when it exists")
    args = parser.parse_args()
    rates = [round(4.0 * 1.04**i, 3) for i in range(24)]  # 4.0-9.9 req/s, 4% apart
    print(f"bench_search_seeds on {platform.node()} ({platform.processor() or platform.machine()}), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-search-seeds-") as tmp:
        root = Path(tmp)
        began = time.perf_counter()
        if args.sweep_file is not None and args.sweep_file.exists():
            kept = json.loads(args.sweep_file.read_text())
            rates, ratios = kept["rates"], kept["ratios"]
            print(f"(the sweep read from {args.sweep_file}, run {kept['when']})")
        else:
            ratios = [sweep_seed(root, 1000 + s, rates) for s in range(args.sweep_seeds)]
            if args.sweep_file is not None:
                when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                args.sweep_file.write_text(json.dumps({"rates": rates, "ratios": ratios, "when": when}))
        samples = np.log(np.array(ratios))
        sweep_s = time.perf_counter() - began
        print(f"\n== the dense sweep: {len(rates)} rates {rates[0]}-{rates[-1]} req/s, {len(samples)} traffic "
              f"samples each ({UNIT_REQUESTS}-request units), {sweep_s:.0f} s ==")  # fmt: skip
        for i, rate in enumerate(rates):
            col = samples[:, i]
            print(f"  {rate:6.3f} req/s  geometric mean {math.exp(np.nanmean(col)):.3f}, spread between samples "
                  f"(sd of log) {np.nanstd(col, ddof=1):.3f}, range {math.exp(np.nanmin(col)):.3f}-"
                  f"{math.exp(np.nanmax(col)):.3f}")  # fmt: skip
        rate_array = np.array(rates)
        reference = root_of(rate_array, samples)
        rng = np.random.default_rng(0)
        draws = [root_of(rate_array, samples[rng.integers(0, len(samples), len(samples))]) for _ in range(2000)]
        found = np.array([d for d in draws if d is not None])
        low, high = np.percentile(found, [2.5, 97.5])
        if reference is None:
            sys.exit("the sweep's means never cross 1")
        rough = first_crossing(rates, samples)
        print(f"  reference crossover: {reference:.3f} req/s (cubic fit; 95% over the sweep's seeds resampled: "
              f"{low:.3f}-{high:.3f}; the means' first crossing: {rough and round(rough, 3)})")  # fmt: skip
        print(f"\n== search first.yaml --arm dyn-single, seeds 0-{args.seeds - 1} ==")
        contains = 0
        for seed in range(args.seeds):
            record = search_seed(root, seed)
            outcome = record["outcome"]
            lo, hi = outcome.get("lo"), outcome.get("hi")
            inside = lo is not None and hi is not None and lo <= reference <= hi
            contains += inside
            points = {p["rate"]: p for p in record["points"]}
            ends = (f"ends on {len(points[lo]['samples'])} and {len(points[hi]['samples'])} samples"
                    if lo in points and hi in points else "")  # fmt: skip
            print(f"  seed {seed}: {outcome['kind']}, bracket {lo}-{hi} req/s"
                  + (f" ({hi / lo - 1:.0%} wide, {ends})" if lo and hi else "")
                  + f", estimate {outcome.get('estimate')}; {len(record['steps'])} units per arm, "
                  f"{record['requests']} requests, {record['seconds']:.0f} s: "
                  f"{'contains' if inside else 'DOES NOT contain'} {reference:.3f}")  # fmt: skip
        print(f"\nsummary: the bracket contains the dense sweep's crossover ({reference:.3f} req/s) in {contains} of "
              f"{args.seeds} seeds (claim: at least 9 of 10)")  # fmt: skip


if __name__ == "__main__":
    main()
