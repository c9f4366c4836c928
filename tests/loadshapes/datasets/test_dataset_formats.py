"""Each data set format read as a request mix: detected (or named), its prompt and output length as vLLM's class
takes them, its category carried; weighted data sets sampled with the campaign's seed; files read in bounded
memory."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from loadshapes.datasets import reading
from loadshapes.datasets.formats import detect
from loadshapes.datasets.index import index
from loadshapes.mixes import RequestMix
from tests.loadshapes.datasets import files

ROWS: dict[str, tuple[dict[str, Any], str, int]] = {
    # format: (a row, the prompt vLLM sends for it, its output length)
    "custom": ({"prompt": "Tell me a story."}, "Tell me a story.", 256),
    "humaneval": ({"task_id": "HumanEval/0", "prompt": "def f(x):\n", "canonical_solution": "..."}, "def f(x):\n", 256),
    "gsm8k": ({"question": "2 + 2?", "answer": "4"}, "2 + 2?", 256),
    "instructcoder": (
        {"instruction": "Rename x.", "input": "x = 1", "output": "y = 1"},
        "x = 1\n\nRename x. Just output the code, do not include any explanation.", 200,
    ),
    "openai_chat": (
        {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
         "max_completion_tokens": 64},
        "Hi?", 64,
    ),
    "openai_completions": ({"model": "m", "prompt": "Once upon", "max_tokens": 32}, "Once upon", 32),
}  # fmt: skip


@pytest.mark.parametrize("fmt", sorted(ROWS))
def test_a_format_detected_and_read(tmp_path: Path, fmt: str) -> None:
    row, prompt, output = ROWS[fmt]
    path = files.jsonl(tmp_path / "rows.jsonl", [row] * 3)
    assert detect(str(path)) == fmt
    (request,) = RequestMix.model_validate({"dataset": str(path)}).sample(1, seed=0)
    assert (request.prompt, request.max_tokens, request.output_tokens, request.category) == (
        prompt,
        output,
        output,
        fmt,
    )


def test_spec_bench_keeps_its_categories_and_mt_bench_is_named(tmp_path: Path) -> None:
    path = files.spec_bench(tmp_path / "question.jsonl")
    assert detect(str(path)) == "spec_bench"
    requests = RequestMix.model_validate({"dataset": str(path)}).sample(40, seed=2)
    assert {r.category for r in requests} == set(files.SPEC_CATEGORIES)
    assert all(r.prompt.startswith("Spec-Bench question") for r in requests)  # turns[0], not the second turn
    named = RequestMix.model_validate({"dataset": str(path), "format": "mt_bench", "category": "mt"}).sample(3, seed=2)
    assert {r.category for r in named} == {"mt"}


def test_specdrill_jsonl_unchanged(tmp_path: Path) -> None:
    path = files.jsonl(tmp_path / "own.jsonl", [{"category": "editing", "prompt": "fix it", "max_tokens": 9}])
    assert detect(str(path)) == "specdrill"
    mix = RequestMix.model_validate({"dataset": str(path)})
    assert mix.sources == [] and mix.sample(2, seed=0)[0].category == "editing"


def test_weighted_data_sets_by_the_seed(tmp_path: Path) -> None:
    spec = files.spec_bench(tmp_path / "question.jsonl")
    sharegpt = files.sharegpt(tmp_path / "ShareGPT.json")
    mix = RequestMix.model_validate({"datasets": [
        {"dataset": str(spec), "categories": ["coding"], "weight": 60}, {"dataset": str(sharegpt), "weight": 40},
    ]})  # fmt: skip
    requests = mix.sample(400, seed=11)
    shares = {c: sum(r.category == c for r in requests) / 400 for c in ("coding", "sharegpt")}
    assert shares["coding"] + shares["sharegpt"] == 1
    assert abs(shares["coding"] - 0.6) < 0.08, shares  # 400 draws: sd 0.025
    # Request i is the same whoever builds it, whatever the split; another seed is another sequence.
    assert mix.at([399, 3, 200], seed=11) == [requests[399], requests[3], requests[200]]
    assert [r.prompt for r in mix.sample(20, seed=12)] != [r.prompt for r in requests[:20]]


def test_a_list_read_across_window_edges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = files.sharegpt(tmp_path / "ShareGPT.json")
    expected = json.loads(path.read_text())
    monkeypatch.setattr(reading, "CHUNK", 7)  # every record crosses several reads, a separator too
    got = list(reading.array_records(str(path)))
    assert [value for _, value in got] == expected
    assert all(reading.record_at(str(path), offset, jsonl=False) == value for offset, value in got)


def test_a_large_list_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    entry = {"conversations": [{"from": "human", "value": "q " * 200}, {"from": "gpt", "value": "a " * 200}]}
    with path.open("w") as handle:
        handle.write("[" + ",".join([json.dumps(entry)] * 12_000) + "]")  # ~10 MB
    size = path.stat().st_size
    tracemalloc.start()
    rows = index(str(path), "sharegpt", None, "qualitative")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(rows) == 12_000
    assert peak < size / 3, (peak, size)
    print(
        f"index of {size / 1e6:.1f} MB: peak {peak / 1e6:.2f} MB traced"
    )  # json.load would hold several times the file


def test_a_record_over_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ShareGPT.json"
    path.write_text(
        json.dumps([{"conversations": []}, {"conversations": [{"from": "human", "value": "x" * (2 << 20)}]}])
    )
    monkeypatch.setattr(reading, "CHUNK", 64 << 10)
    monkeypatch.setattr(reading, "MAX_RECORD_BYTES", 1 << 20)
    with pytest.raises(reading.DatasetError, match=r"record 2 \(byte 24\): over 1 MiB, or not JSON"):
        list(reading.array_records(str(path)))


def test_specdrill_jsonl_weighted_with_another(tmp_path: Path) -> None:
    own = files.jsonl(tmp_path / "own.jsonl", [{"category": "editing", "prompt": "fix it", "max_tokens": 9}])
    spec = files.spec_bench(tmp_path / "question.jsonl")
    mix = RequestMix.model_validate(
        {"datasets": [{"dataset": str(own)}, {"dataset": str(spec), "categories": ["stem"]}]}
    )
    requests = mix.sample(30, seed=0)
    assert {(r.category, r.max_tokens) for r in requests} == {("editing", 9), ("stem", 256)}


class CharTokenizer:
    """A served model's tokenizer as the mix uses it (name, special tokens, count): one token a character."""

    name = "chars"
    add_special_tokens = False

    def count(self, text: str) -> int:
        return len(text)


def test_lengths_are_the_tokenizers_and_filter_by_it(tmp_path: Path) -> None:
    long_in_characters = {"from": "human", "value": "abcd " * 300}  # 300 words, 1500 characters
    reply = {"from": "gpt", "value": "fine thanks " * 10}
    short = {"from": "human", "value": "how are you today?"}
    path = tmp_path / "ShareGPT.json"
    path.write_text(json.dumps([{"conversations": [long_in_characters, reply]}, {"conversations": [short, reply]}]))
    mix = RequestMix.model_validate({"dataset": str(path)})
    counted = mix.sample(4, seed=0, tokenizer=CharTokenizer())  # type: ignore[arg-type]
    assert all(r.prompt == short["value"] for r in counted)  # over 1024 tokens of this tokenizer: skipped as vLLM does
    assert counted[0].prompt_tokens == len(short["value"]) and counted[0].max_tokens == len(reply["value"])
    in_words = mix.sample(4, seed=0)
    assert {r.prompt_tokens for r in in_words} == {300, 4}  # in words both pairs are within the limits


def test_a_replayed_trace_takes_its_categories_from_the_data_sets(tmp_path: Path) -> None:
    import numpy as np

    from loadshapes.mixes import ReplayedRequests

    spec = files.spec_bench(tmp_path / "question.jsonl")
    mix = RequestMix.model_validate({"dataset": str(spec), "categories": ["coding", "stem"]})
    recorded = ReplayedRequests(
        prompt_tokens=np.array([50, 60, 70]), output_tokens=np.array([5, 6, 7]), categories=[None, "chat", None],
        prefixes=None, expect_error=np.zeros(3, bool),
    )  # fmt: skip
    requests = mix.replayed([0, 1, 2], seed=3, recorded=recorded)
    drawn = mix.at([0, 2], seed=3)
    assert [r.category for r in requests] == [drawn[0].category, "chat", drawn[1].category]
    assert {drawn[0].category, drawn[1].category} <= {"coding", "stem"}
    assert [r.max_tokens for r in requests] == [5, 6, 7]  # the trace's lengths, as for any replay


def test_a_campaigns_identity_is_its_data_sets_content(tmp_path: Path) -> None:
    from loadshapes.campaign_files import file_identity, located_files_replaced

    spec = files.spec_bench(tmp_path / "question.jsonl")
    dumped = RequestMix.model_validate({"datasets": [{"dataset": str(spec)}]}).model_dump(mode="json")
    replaced = located_files_replaced({"mix": dumped})
    assert replaced["mix"]["datasets"][0]["dataset"] == file_identity(str(spec))
    assert file_identity(str(spec)).startswith("sha256:")
