"""Third-party clients against a specdrill arm: the `openai` package and GuideLLM, on loopback.

Deploys one simulated arm (fixed k = 3) on a local Ray, drives it with the openai client (closed loop, fixed
concurrency) and with GuideLLM (open loop, Poisson), and prints what each saw next to what the arm's own
telemetry says. GuideLLM runs from its own venv (`make bench-clients` builds .venv-guidellm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.execute.deploy import deploy
from orchestrator.plan.campaign import Campaign
from tests.ray_helpers import free_port, local_ray
from tests.tiny_model import build_tiny_llama

MODEL = "sim-llama3.1-8b-h100-eagle"


def openai_closed_loop(url: str, requests: int, concurrency: int) -> dict[str, Any]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def one(i: int) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        body = client.completions.create(
            model=MODEL, prompt="word " * 64, max_tokens=32, extra_body={"ignore_eos": True}
        ).model_dump()
        return time.perf_counter() - t0, body

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - t0
    client_e2e = [r[0] for r in results]
    server_e2e = [
        r[1]["specdrill"]["timestamps"]["done"] - r[1]["specdrill"]["timestamps"]["received"] for r in results
    ]
    return {
        "requests": requests,
        "completed": sum(r[1]["usage"]["completion_tokens"] == 32 for r in results),
        "throughput_req_s": requests / wall,
        "client_e2e_p50_s": statistics.median(client_e2e),
        "server_e2e_p50_s": statistics.median(server_e2e),
        "mean_executed_k": statistics.mean(k for r in results for k in r[1]["specdrill"]["executed"]["step_k"]),
    }


def guidellm_open_loop(guidellm: str, url: str, tokenizer_dir: str, rate: float, seconds: float) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="guidellm")) / "report.json"
    cmd = [
        guidellm, "run",
        "--backend", f"kind=openai_http,target={url},model={MODEL}",
        "--profile", f"kind=poisson,rate={rate}",
        "--constraint", f"kind=max_duration,seconds={seconds}",
        "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=32",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir}",
        "--output", f"kind=json,path={out}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds * 10 + 300, check=False)
    result: dict[str, Any] = {
        "command": " ".join(cmd),
        "returncode": proc.returncode,
        "wall_s": time.perf_counter() - t0,
    }
    if proc.returncode != 0 or not out.exists():
        result["stderr_tail"] = proc.stderr[-2000:]
        return result
    report = json.loads(out.read_text())
    benchmark = report["benchmarks"][0]
    totals = benchmark.get("metrics", {}).get("request_totals", {}) or benchmark.get("request_totals", {})
    result.update({"request_totals": totals, "report": str(out)})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--guidellm", default=str(Path(".venv-guidellm/bin/guidellm")))
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    tokenizer_dir = str(build_tiny_llama(Path(tempfile.gettempdir()) / "specdrill-tiny-llama"))
    with local_ray(num_cpus=4):
        campaign = Campaign.model_validate(
            {
                "name": "bench",
                "engine": {"kind": "simulated", "time_scale": 1.0},
                "policies": {"fixed3": "fixed:3"},
                "serve": {"host": "127.0.0.1", "port": free_port()},
            }
        )
        url = deploy(campaign)["fixed3-single"]
        result: dict[str, Any] = {"arm": url, "openai": openai_closed_loop(url, requests=100, concurrency=8)}
        if Path(args.guidellm).exists():
            result["guidellm"] = guidellm_open_loop(args.guidellm, url, tokenizer_dir, args.rate, args.seconds)
        else:
            result["guidellm"] = f"not installed at {args.guidellm}: run `make bench-clients`"
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
