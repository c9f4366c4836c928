"""How fast the virtual-time simulator goes: one hour of open-loop traffic at 20 req/s, one policy.

Prints simulated requests per wall second and, as the same-run baseline, the speed of stepping the engine one
step at a time (max_window=1), so the ratio shows what the vectorised decode windows buy. Target: the hour in
<= 10 s of wall time on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import time

from loadshapes.arrivals import poisson_arrivals
from loadshapes.mixes import Fixed, LogNormal, Workload
from orchestrator.virtual.experiments import make_requests
from serve_apps.policies import parse_policy
from serve_apps.sim.engine import EngineCore
from serve_apps.sim.profile import load_profile
from serve_apps.sim.virtual import run_open_loop


def run_once(simulated_seconds: float, rate: float, policy_text: str, max_window: int) -> dict[str, float]:
    profile = load_profile("llama3.1-8b-h100-eagle")
    policy = parse_policy(policy_text, default_method=profile.drafter_method, default_model=profile.drafter_model)
    workload = Workload(
        name="bench",
        category="reasoning",
        prompt_tokens=LogNormal(median=256, sigma=0.5, low=16, high=2048),
        output_tokens=Fixed(value=256),
        max_tokens=256,
    )
    arrivals = poisson_arrivals(rate, simulated_seconds, seed=7)
    requests = make_requests(workload, arrivals, seed=8)
    core = EngineCore(profile, policy.resolve(), seed=9, max_window=max_window)
    t0 = time.perf_counter()
    run = run_open_loop(core, requests)
    wall = time.perf_counter() - t0
    tokens = sum(r.output_tokens for r in run.records)
    return {
        "simulated_s": simulated_seconds,
        "requests": len(run.records),
        "output_tokens": tokens,
        "engine_steps": core.steps.count,
        "wall_s": wall,
        "requests_per_wall_s": len(run.records) / wall,
        "simulated_s_per_wall_s": run.end / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--policy", default="fixed:3")
    parser.add_argument("--baseline-seconds", type=float, default=300.0)
    args = parser.parse_args()
    windowed = run_once(args.seconds, args.rate, args.policy, max_window=256)
    stepwise = run_once(args.baseline_seconds, args.rate, args.policy, max_window=1)
    result = {
        "windowed": windowed,
        "stepwise_baseline": stepwise,
        "speedup_vs_stepwise": windowed["requests_per_wall_s"] / stepwise["requests_per_wall_s"],
        "target_hour_wall_s": 10.0,
        "hour_wall_s_estimate": 3600.0 / windowed["simulated_s_per_wall_s"],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
