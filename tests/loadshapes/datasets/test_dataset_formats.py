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
