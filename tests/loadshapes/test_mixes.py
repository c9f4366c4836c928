from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from loadshapes.mixes import RequestMix, load_jsonl


def test_weighted_mix_is_seeded_and_respects_weights() -> None:
    mix = RequestMix.model_validate(
        {"entries": [{"workload": "chat", "weight": 3}, {"workload": "editing", "weight": 1}]}
    )
    a = mix.sample(400, seed=4)
    assert a == mix.sample(400, seed=4) and a != mix.sample(400, seed=5)
    counts = Counter(r.category for r in a)
    assert set(counts) == {"chat", "editing"} and 0.65 < counts["chat"] / 400 < 0.85
    for r in a:
        assert len(r.prompt.split()) == r.prompt_tokens
        assert r.output_tokens is not None and r.output_tokens <= r.max_tokens
        assert r.body_hints()["category"] == r.category
    editing = next(r for r in a if r.category == "editing")
    assert editing.prompt.startswith("Rewrite the code below exactly")


def test_mix_errors() -> None:
    with pytest.raises(ValidationError, match="unknown workload 'poems'"):
        RequestMix.model_validate({"entries": [{"workload": "poems", "weight": 1}]})
    with pytest.raises(ValidationError, match="one of entries"):
        RequestMix.model_validate({})


def test_user_jsonl_dataset(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"category": "chat", "prompt": "what is a token", "max_tokens": 20}\n\n'
        '{"category": "editing", "prompt": "fix this", "max_tokens": 50, "output_tokens": 40}\n'
    )
    specs = load_jsonl(str(path))
    assert [s.prompt_tokens for s in specs] == [4, 2]
    sampled = RequestMix(dataset=str(path)).sample(10, seed=1)
    assert {s.category for s in sampled} <= {"chat", "editing"} and len(sampled) == 10
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"category": "chat", "prompt": "x", "max_tokens": 5}\n{"category": "chat", "prompt": "y"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: max_tokens: Field required"):
        load_jsonl(str(bad))
