"""What `vllm bench forward --output-json` would write for examples/bench-forward/*.yaml on an engine whose forward
costs exactly the shipped EAGLE profile's cost model: tests/data/vllm-bench-forward/*.json.gz (gzipped: 626 KB of
JSON as vLLM indents it, 52 KB so; the tests unpack them). No real bench ran here
(no GPU, no vLLM 0.33+ build for a CPU): the files are written in the format the wheels' code writes, read from
vLLM 0.33.0 and 0.34.0 (paths under vllm/benchmarks/forward/, 0.34's lines):

- main.py:265-271, 294-296: the list, one {"case", "requests", "median_us", "ranks"} per case, indent=2;
- main.py:225-230 + capture.py:111-115, 154-156, 243-254, 290-303: a rank's record;
- shapes.py:65-84: --kv-len-jitter (default 0.5, seed 0: EngineArgs' default, config/model.py:220), applied to
  the cases before they run (main.py:251-253), so `requests` has the jittered KV lengths;
- speculator.py:82-95: the drafter's record (its num_draft_tokens is the configured k).

A case's replays are the profile's forward (verify, plus the drafter's cost where it is timed; no step_overhead,
which the bench does not time: main.py:7-9) times 1 + 0.4% seeded normal noise, 20 iters x 5 samples (the
defaults). Fields calibrate does not read carry plausible values (one KV group of 16-token blocks, 64 KiB per
block and layer: Llama-3.1-8B in fp16).

Rewrite them: `.venv/bin/python -m tests.orchestrator.calibrate.bench_forward_fixture`.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from serve_apps.sim.profile import Profile, load_profile
from tests import REPO

SHAPES = REPO / "examples" / "bench-forward"
FIXTURES = REPO / "tests" / "data" / "vllm-bench-forward"
PROFILE = "llama3.1-8b-h100-eagle"
RUNS = {"verify": None, "drafter-k1": 1, "drafter-k4": 4}  # file stem -> the drafter's k where it is timed
MAX_MODEL_LEN = 8192  # the recipe's --max-model-len
JITTER, SEED, ITERS, SAMPLES, NOISE = 0.5, 0, 20, 5, 0.004
BLOCK, BLOCK_BYTES_PER_LAYER, LAYERS = 16, 64 << 10, 32


@dataclass(frozen=True)
class Request:
    query_len: int
    kv_len: int
    num_draft_tokens: int = 0
    chunked: bool = False


def load_cases(path: Path) -> list[tuple[str, list[Request]]]:
    """shapes.py:116-137: a request's `count` repeats it."""
    cases = []
    for case in yaml.safe_load(path.read_text())["cases"]:
        requests: list[Request] = []
        for req in case["requests"]:
            req = dict(req)
            count = req.pop("count", 1)
            requests.extend([Request(**req)] * count)
        cases.append((case["name"], requests))
    return cases


def jitter(name: str, requests: list[Request]) -> list[Request]:
    """shapes.py:65-84, verbatim in effect: the prefix drawn within +-JITTER, seeded by the seed and the name."""
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    out = []
    for req in requests:
        prefix = req.kv_len - req.query_len
        if prefix and JITTER:
            prefix = max(1, round(prefix * rng.uniform(1 - JITTER, 1 + JITTER)))
        out.append(Request(req.query_len, min(req.query_len + prefix, MAX_MODEL_LEN), req.num_draft_tokens,
                           req.chunked))  # fmt: skip
    return out


def forward_seconds(profile: Profile, requests: list[Request], k: int | None) -> float:
    kv = sum(r.kv_len for r in requests)
    batched = sum(r.query_len for r in requests)
    v, d = profile.verify, profile.draft
    seconds = v.per_kv_token * kv + v.per_batched_token * batched + v.fixed
    if k:
        seconds += d.per_kv_token * kv + d.per_draft_token * k + d.fixed
    return seconds


def latency(true_us: float, rng: np.random.Generator) -> dict[str, Any]:
    """capture.py:272-303's record of ITERS x SAMPLES replays (float32, as torch's tensor of them)."""
    arr = np.asarray(true_us * (1 + NOISE * rng.standard_normal(ITERS * SAMPLES)), dtype=np.float32)
    sample_medians = np.median(arr.reshape(SAMPLES, -1), axis=1)
    median = float(np.median(arr))
    return {
        "timer": "graph_events",
        "median": median,
        "sample_spread_pct": float(100 * (sample_medians.max() - sample_medians.min()) / median),
        "mean": float(arr.mean()),
        "std": float(arr.std()),
        "min": float(arr.min()),
        "p90": float(np.percentile(arr, 90)),
        "count": len(arr),
        "samples_us": [round(float(t), 2) for t in arr],
    }


def rank_record(name: str, requests: list[Request], k: int | None, true_us: float) -> dict[str, Any]:
    lookahead = k + 1 if k else 0  # main.py:166-170
    tokens = sum(r.query_len for r in requests)
    layers = LAYERS + (1 if k else 0)
    blocks = [-(-(r.kv_len + lookahead) // BLOCK) for r in requests]
    touched = sum(min(b, -(-r.query_len // BLOCK) + 2) for r, b in zip(requests, blocks, strict=True))
    record: dict[str, Any] = {
        "num_tokens": tokens,
        "kv_blocks": 1 + sum(blocks),  # batch.py:151, the cursor after block 0 (the null block)
        "routing": "real",  # routing.py:128, 275-279: auto falls back to real on a model without MoE gates
        "num_local_tokens": tokens,
        "num_tokens_after_padding": tokens,
        "batch_order": [f"bench-{i}" for i in range(len(requests))],
        "timing_scope": "target_and_drafter" if k else "target_only",
        "eager_repeat": {"max_abs": 0.0, "relative_rms": 0.0},
        "graph_vs_eager": {"max_abs": 0.0, "relative_rms": 0.0},
        "graph_deterministic": True,
        "finite": True,
        "state_reset_bytes": touched * BLOCK_BYTES_PER_LAYER * layers,
    }
    if k:
        record["drafter"] = {"method": "eagle", "acceptance": "all", "num_draft_tokens": k,
                             "output_shape": [len(requests), k], "graph_matches_eager": True,
                             "valid_token_ids": True}  # fmt: skip
    record["latency_us"] = latency(true_us, np.random.default_rng([1, zlib.crc32(name.encode()), k or 0]))
    return record


def results(stem: str, profile: Profile) -> list[dict[str, Any]]:
    k = RUNS[stem]
    out = []
    for name, shaped in load_cases(SHAPES / f"{stem}.yaml"):
        requests = jitter(name, shaped)
        rank = rank_record(name, requests, k, forward_seconds(profile, requests, k) * 1e6)
        out.append({"case": name, "requests": [r.__dict__ for r in requests],
                    "median_us": rank["latency_us"]["median"], "ranks": [rank]})  # fmt: skip
    return out


def text(stem: str, profile: Profile | None = None) -> str:
    return json.dumps(results(stem, profile or load_profile(PROFILE)), indent=2)


def fixture(stem: str) -> Path:
    return FIXTURES / f"{stem}.json.gz"


def unpack(stem: str, into: Path) -> Path:
    """The fixture as the file vLLM writes, under `into`."""
    path = into / f"{stem}.json"
    path.write_bytes(gzip.decompress(fixture(stem).read_bytes()))
    return path


if __name__ == "__main__":
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for stem in RUNS:
        fixture(stem).write_bytes(gzip.compress(text(stem).encode(), compresslevel=9, mtime=0))
        print(f"wrote {fixture(stem)}")
