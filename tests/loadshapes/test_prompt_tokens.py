"""Prompt lengths in the served model's tokens: exact counts under two tokenizers trained here (byte-level, as the
tiny Llama's, and SentencePiece-like with a BOS, as Llama 2's), the tokenizer each engine kind's plans carry,
and the line a run starts with when an endpoint names none. The server-side check is in
tests/serve_apps/test_serve_vllm.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from loadshapes.mixes import ReplayedRequests, RequestMix
from loadshapes.plan import WorkerPlan, open_loop_schedule
from loadshapes.prompts import PROMPT_BUILDERS, PrefixBlocks
from loadshapes.tokens import PromptTokenizer, TokenizerUnavailable, local_prompt_tokenizer
from orchestrator.cli import cli
from orchestrator.plan.campaign import Campaign
from orchestrator.rundir.layout import Unit
from orchestrator.rundir.manifest import plans_for
from tests.tiny_model import build_tiny_tokenizer

ALL = {"entries": [{"workload": name, "weight": 1} for name in ("reasoning", "chat", "editing")]}


@pytest.fixture(scope="module", params=["byte-level", "metaspace"])
def tokenizer_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_tokenizer(tmp_path_factory.mktemp(request.param), style=request.param))


def _fixed(category: str, length: int) -> RequestMix:
    workload = {"name": "w", "category": category, "prompt_tokens": {"kind": "fixed", "value": length},
                "output_tokens": {"kind": "fixed", "value": 8}, "max_tokens": 8}  # fmt: skip
    return RequestMix.model_validate({"entries": [{"workload": workload, "weight": 1}]})


def _served(path: str) -> Any:
    """The tokenizer as vLLM loads it (transformers), counting a completion's prompt as vLLM does."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_every_category_and_length_is_exact_in_tokens(tokenizer_dir: str) -> None:
    tok = local_prompt_tokenizer(tokenizer_dir, add_special_tokens=True)
    served = _served(tokenizer_dir)
    for category in PROMPT_BUILDERS:
        for length in (1, 2, 3, 7, 128, 1000):
            specs = _fixed(category, length).sample(5, seed=11, tokenizer=tok)
            assert [len(served.encode(s.prompt)) for s in specs] == [length] * 5, (category, length)
    mixed = RequestMix.model_validate(ALL).sample(200, seed=3, tokenizer=tok)
    assert [len(served.encode(s.prompt)) for s in mixed] == [s.prompt_tokens for s in mixed]
    assert len({s.prompt_tokens for s in mixed}) > 50  # the lognormal lengths, not one size


def test_token_sized_prompts_are_seeded_and_keep_the_categorys_text(tokenizer_dir: str) -> None:
    tok = local_prompt_tokenizer(tokenizer_dir, add_special_tokens=True)
    from tokenizers import Tokenizer

    fresh = PromptTokenizer("again", Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json"), add_special_tokens=True)
    mix = RequestMix.model_validate(ALL)
    first = mix.at([5, 17, 40], seed=9, tokenizer=tok)
    assert first == mix.at([5, 17, 40], seed=9, tokenizer=fresh)
    assert [s.prompt for s in first] == [mix.at([i], seed=9, tokenizer=tok)[0].prompt for i in (5, 17, 40)]
    assert [s.prompt for s in mix.at([5, 17, 40], seed=10, tokenizer=tok)] != [s.prompt for s in first]
    # Fitted to a token count, a prompt is still its category's text: the GSM8K-style question, the code to edit.
    assert "Think step by step" in _fixed("reasoning", 300).sample(1, seed=1, tokenizer=tok)[0].prompt
    assert "Rewrite the code below exactly" in _fixed("editing", 300).sample(1, seed=1, tokenizer=tok)[0].prompt


def test_prompt_tokens_include_the_bos_the_server_counts(tmp_path: Path) -> None:
    tok = local_prompt_tokenizer(
        str(build_tiny_tokenizer(tmp_path / "llama2ish", style="metaspace")), add_special_tokens=True
    )
    assert tok.special == 1
    spec = _fixed("chat", 128).sample(1, seed=2, tokenizer=tok)[0]
    served = _served(tok.name)
    ids = served.encode(spec.prompt, add_special_tokens=True)
    assert len(ids) == 128 and ids[0] == served.bos_token_id
    assert len(served.encode(spec.prompt, add_special_tokens=False)) == 127
    # A chat prompt's special tokens come from the server's chat template: the count is the content's.
    chat = local_prompt_tokenizer(tok.name, add_special_tokens=False)
    assert chat.special == 0
    assert len(served.encode(_fixed("chat", 128).sample(1, seed=2, tokenizer=chat)[0].prompt,
                                      add_special_tokens=False)) == 128  # fmt: skip


def test_replayed_prefixes_are_exact_and_shared(tokenizer_dir: str) -> None:
    tok = local_prompt_tokenizer(tokenizer_dir, add_special_tokens=True)
    recorded = ReplayedRequests(
        prompt_tokens=np.array([900, 1000, 200]), output_tokens=np.array([8, 8, 8]), categories=["chat"] * 3,
        prefixes=[PrefixBlocks((1, 2, 3), 16), PrefixBlocks((1, 2, 4, 5), 16), PrefixBlocks((7,), 16)],
        expect_error=np.zeros(3, dtype=bool),
    )  # fmt: skip
    specs = RequestMix.model_validate(ALL).replayed([0, 1, 2], seed=4, recorded=recorded, tokenizer=tok)
    assert [tok.count(s.prompt) for s in specs] == [900, 1000, 200]
    # Requests 0 and 1 share hash ids 1 and 2: their first two 16-word blocks are the same text; request 2's not.
    words = [s.prompt.split() for s in specs]
    assert min(len(w) for w in words) > 32
    assert words[0][:32] == words[1][:32] and words[0][:16] != words[2][:16]


def test_a_datasets_prompts_are_counted_in_tokens(tmp_path: Path, tokenizer_dir: str) -> None:
    tok = local_prompt_tokenizer(tokenizer_dir, add_special_tokens=True)
    path = tmp_path / "data.jsonl"
    prompt = "Summarise these notes on draft verification, please"
    path.write_text(json.dumps({"category": "chat", "prompt": prompt, "max_tokens": 4}) + "\n")
    mix = RequestMix.model_validate({"dataset": str(path)})
    assert mix.sample(1, seed=0)[0].prompt_tokens == 7  # words, without a tokenizer
    spec = mix.sample(1, seed=0, tokenizer=tok)[0]
    assert spec.prompt == prompt and spec.prompt_tokens == tok.count(prompt) != 7


def test_a_tokenizer_not_on_this_machine_is_one_line_and_never_downloaded(tmp_path: Path) -> None:
    for name in (str(tmp_path / "nowhere"), "specdrill-no-such-org/no-such-model"):
        with pytest.raises(TokenizerUnavailable) as caught:
            local_prompt_tokenizer(name, add_special_tokens=True)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"tokenizer {name}: not loadable from local files")


def _campaign_data(tmp_path: Path, engine: dict[str, object], endpoint: str = "completions") -> dict[str, object]:
    return {
        "name": "tok", "engine": engine, "policies": {"off": "off"}, "topologies": {"single": "single"},
        "mix": ALL, "shapes": {"s": {"kind": "sustained", "rate": 2.0, "duration_s": 3}},
        "load": {"endpoint": endpoint}, "output": str(tmp_path / "run"),
    }  # fmt: skip


def _campaign(tmp_path: Path, engine: dict[str, object], endpoint: str = "completions") -> Campaign:
    return Campaign.model_validate(_campaign_data(tmp_path, engine, endpoint))


def test_each_engine_kinds_plans_name_the_tokenizer_that_counts(tmp_path: Path, tokenizer_dir: str) -> None:
    def plan_of(engine: dict[str, object], endpoint: str = "completions"):  # type: ignore[no-untyped-def]
        campaign = _campaign(tmp_path, engine, endpoint)
        arm = campaign.arms()[0]
        return plans_for(campaign, arm, Unit(arm=arm.name, shape="s", repeat=0), run="r", url="http://x", traces="t")[0]

    assert plan_of({"kind": "vllm", "model": tokenizer_dir}).tokenizer == tokenizer_dir
    vllm_own = plan_of({"kind": "vllm", "model": "/models/m", "engine_kwargs": {"tokenizer": tokenizer_dir}})
    assert vllm_own.tokenizer == tokenizer_dir
    assert plan_of({"kind": "simulated"}).tokenizer is None
    urls = {"urls": {"off-single": "http://127.0.0.1:9"}, "model": "m"}
    assert plan_of({"kind": "endpoint", **urls}).tokenizer is None
    named = plan_of({"kind": "endpoint", **urls, "tokenizer": tokenizer_dir})
    assert named.tokenizer == tokenizer_dir
    tok = local_prompt_tokenizer(tokenizer_dir, add_special_tokens=True)
    schedule = open_loop_schedule(named)
    assert schedule and all(tok.count(p.spec.prompt) == p.spec.prompt_tokens for p in schedule)
    # The worker reads its plan from a file, the tokenizer inside it: the same bodies where the files are not.
    copy = tmp_path / "tokenizer-copy"
    shutil.copytree(tokenizer_dir, copy)
    shipped = plan_of({"kind": "endpoint", **urls, "tokenizer": str(copy)}).model_dump_json()
    shutil.rmtree(copy)
    again = WorkerPlan.model_validate_json(shipped)
    assert again.tokenizer == str(copy) and [p.body for p in open_loop_schedule(again)] == [p.body for p in schedule]
    chat = plan_of({"kind": "endpoint", **urls, "tokenizer": tokenizer_dir}, endpoint="chat")
    content = local_prompt_tokenizer(tokenizer_dir, add_special_tokens=False)
    assert all(content.count(p.spec.prompt) == p.spec.prompt_tokens for p in open_loop_schedule(chat))


def test_an_endpoint_without_a_tokenizer_is_said_in_one_line_at_run_start(tmp_path: Path, tokenizer_dir: str) -> None:
    import yaml

    path = tmp_path / "c.yaml"
    engine = {"kind": "endpoint", "model": "served-llama", "urls": {"off-single": "http://127.0.0.1:9"}}
    path.write_text(yaml.safe_dump(_campaign_data(tmp_path, engine)))
    result = CliRunner().invoke(cli, ["run", str(path)])
    notice = (
        "prompt lengths are words: no tokenizer known for endpoint model served-llama; set engine.tokenizer "
        "(a local path or a cached Hugging Face id) to size prompts in its tokens"
    )
    assert result.output.splitlines()[0] == notice
    assert "engine.urls.off-single: http://127.0.0.1:9 is unreachable" in result.output  # the run stops there
    path.write_text(yaml.safe_dump(_campaign_data(tmp_path, {**engine, "tokenizer": tokenizer_dir})))
    named = CliRunner().invoke(cli, ["run", str(path)])
    assert "prompt lengths are words" not in named.output and "is unreachable" in named.output


def test_a_tokenizer_that_is_not_here_stops_the_run_before_anything_starts(tmp_path: Path) -> None:
    import yaml

    from orchestrator.plan.generated_text import GENERATED_MARK

    path = tmp_path / "c.yaml"
    missing = tmp_path / "no-tokenizer"
    for engine, field in (
        ({"kind": "endpoint", "model": "m", "urls": {"off-single": "http://127.0.0.1:9"}, "tokenizer": str(missing)},
         "engine.tokenizer"),
        ({"kind": "vllm", "model": str(missing)}, "engine.model"),
        ({"kind": "vllm", "model": "/models/m", "engine_kwargs": {"tokenizer": str(missing)}},
         "engine.engine_kwargs.tokenizer"),
    ):  # fmt: skip
        path.write_text(yaml.safe_dump(_campaign_data(tmp_path, engine)))
        result = CliRunner().invoke(cli, ["run", str(path)])
        # a real engine sent template text: that line first (orchestrator/plan/generated_text.py), then the refusal
        lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith(GENERATED_MARK)]
        assert result.exit_code == 1 and len(lines) == 1, result.output
        assert lines[0].startswith(f"Error: {field}: tokenizer {missing}: not loadable from local files")
        assert lines[0].endswith("`specdrill models pull CAMPAIGN --here` caches a Hugging Face model here)")
    assert not (tmp_path / "run").exists()
