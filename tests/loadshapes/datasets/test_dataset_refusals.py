"""A data set a campaign cannot use is refused by `specdrill simulate` in one line naming the file and what is
wrong, exit 2, before the run's folder exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadshapes.mixes import RequestMix
from orchestrator.cli import main
from tests.loadshapes.datasets import files


def simulate(
    tmp_path: Path, mix: dict[str, Any], capsys: pytest.CaptureFixture[str], *, command: str = "simulate",
    max_model_len: int = 8192, name: str = "c.yaml",
) -> str:  # fmt: skip
    """`specdrill simulate` (or `run`) on a small campaign with `mix`: its one error line (asserting exit 2, nothing
    written)."""
    output = tmp_path / "run"
    campaign = tmp_path / name
    campaign.write_text(yaml.safe_dump({
        "name": "datasets",
        "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle", "max_model_len": max_model_len},
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": {"s": {"kind": "sustained", "rate": 5, "duration_s": 2}}, "mix": mix, "output": str(output),
    }))  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main([command, str(campaign)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2, err
    assert len(err) == 1 and err[0].startswith("specdrill: error: "), err
    assert not output.exists()
    return err[0]


def test_a_file_in_none_of_the_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = files.jsonl(tmp_path / "rows.jsonl", [{"text": "hello", "label": 3}])
    line = simulate(tmp_path, {"dataset": "rows.jsonl"}, capsys)
    assert str(path) in line and "not a data set in any known format" in line
    for tried in ("sharegpt", "spec_bench", "speed_bench", "custom", "openai_chat", "specdrill"):
        assert tried in line, line


def test_a_sharegpt_entry_that_is_not_a_conversation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries = json.loads(files.sharegpt(tmp_path / "sg.json").read_text())
    entries[4]["conversations"][1] = {"role": "assistant", "content": "hi"}  # no `from`/`value`
    (tmp_path / "sg.json").write_text(json.dumps(entries))
    line = simulate(tmp_path, {"dataset": "sg.json"}, capsys)
    assert "sg.json: record 5: not a sharegpt row: conversations.1.from: Field required" in line, line


def test_a_sharegpt_file_cut_short(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = files.sharegpt(tmp_path / "sg.json").read_text()
    (tmp_path / "sg.json").write_text(text[: len(text) // 2])
    line = simulate(tmp_path, {"dataset": "sg.json"}, capsys)
    assert "sg.json: record" in line and "the file is truncated" in line, line


def test_an_empty_category_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files.spec_bench(tmp_path / "question.jsonl")
    line = simulate(tmp_path, {"dataset": "question.jsonl", "categories": ["poetry"]}, capsys)
    assert "question.jsonl: no spec_bench rows in categories poetry; the file has coding (8)" in line, line


def test_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = simulate(tmp_path, {"datasets": [{"dataset": "gone.json", "weight": 1}]}, capsys)
    assert "gone.json: no such data set file or directory" in line, line


def test_a_named_format_the_file_is_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files.spec_bench(tmp_path / "question.jsonl")
    line = simulate(tmp_path, {"dataset": "question.jsonl", "format": "gsm8k"}, capsys)
    assert "question.jsonl:1: not a gsm8k row: question: Field required" in line, line


def test_a_weighted_mix_of_data_sets_simulates_with_its_categories(tmp_path: Path) -> None:
    """The operator page's example: 60% Spec-Bench coding, 40% ShareGPT; every arm gets the same requests, each
    with its category in the trace."""
    import pyarrow.dataset as ds

    files.spec_bench(tmp_path / "question.jsonl")
    files.sharegpt(tmp_path / "ShareGPT_V3_unfiltered_cleaned_split.json")
    campaign = tmp_path / "mixed.yaml"
    campaign.write_text(yaml.safe_dump({
        "name": "datasets", "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": {"steady": {"kind": "sustained", "rate": 4, "duration_s": 30}},
        "mix": {"datasets": [
            {"dataset": "question.jsonl", "categories": ["coding"], "weight": 60},
            {"dataset": "ShareGPT_V3_unfiltered_cleaned_split.json", "weight": 40},
        ]},
        "output": str(tmp_path / "runs" / "mixed"),
    }))  # fmt: skip
    main(["simulate", str(campaign), "--no-report"])
    table = ds.dataset(tmp_path / "runs" / "mixed" / "traces", format="parquet", partitioning="hive").to_table()
    rows = table.select(["policy", "request_index", "category", "prompt_tokens"]).to_pylist()
    by_arm: dict[str, list[tuple[int, str, int]]] = {}
    for r in rows:
        by_arm.setdefault(r["policy"], []).append((r["request_index"], r["category"], r["prompt_tokens"]))
    arms = [sorted(v) for v in by_arm.values()]
    assert len(arms) == 2 and arms[0] == arms[1]  # the same requests in both arms
    categories = [c for _, c, _ in arms[0]]
    assert set(categories) == {"coding", "sharegpt"}
    assert 0.45 < categories.count("coding") / len(categories) < 0.75, categories


def test_a_sharegpt_file_without_a_conversation_to_send(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM drops entries with fewer than two turns; a file of only those has nothing to send."""
    (tmp_path / "sg.json").write_text(json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}]))
    line = simulate(tmp_path, {"dataset": "sg.json"}, capsys)
    assert "sg.json: no sharegpt rows to send (none with two turns)" in line, line


def _all_too_long(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Every Spec-Bench row asks its prompt + 256 output tokens (vLLM's default): none fits a 64-token context. The
    line names the file, the limit, the shortest and longest request and whose counts they are."""
    path = files.spec_bench(tmp_path / "question.jsonl")
    lengths = [len(json.loads(row)["turns"][0].split()) + 256 for row in path.read_text().splitlines()]
    line = simulate(
        tmp_path, {"dataset": "question.jsonl"}, capsys, command=command, max_model_len=64, name="tiny-context.yaml"
    )
    assert (
        f"question.jsonl: all 32 spec_bench rows are longer than max_model_len 64: prompt + output {min(lengths)} to "
        f"{max(lengths)} words, counted in words: no tokenizer known, so the lengths are estimates; raise the "
        "engine's max_model_len" in line
    ), line


def test_prompts_all_longer_than_max_model_len(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _all_too_long(tmp_path, capsys, "simulate")


def test_prompts_all_longer_than_max_model_len_refuse_a_real_time_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specdrill run` refuses it the same way, before it looks for a Ray cluster."""
    _all_too_long(tmp_path, capsys, "run")


def test_a_sharegpt_file_without_a_human_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Entries are sent as vLLM sends them (turn 0 the prompt, whoever speaks it: a third of ShareGPT V3's start with
    the model's turn); a file in which no entry has a person's turn is refused."""
    turn = {"from": "gpt", "value": "The sea is wide and deep, and the sky is blue."}
    entries = [{"id": str(i), "conversations": [turn, {**turn, "from": "system"}]} for i in range(5)]
    (tmp_path / "sg.json").write_text(json.dumps(entries))
    line = simulate(tmp_path, {"dataset": "sg.json"}, capsys)
    assert "sg.json: none of its 5 sharegpt entries with two turns has a human turn (`from`: human or user)" in line

    # One entry with a person's turn, even second: the file is conversations, every entry sent as vLLM sends it.
    entries[3]["conversations"].append({"from": "human", "value": "and then?"})
    (tmp_path / "sg.json").write_text(json.dumps(entries))
    assert RequestMix.model_validate({"dataset": str(tmp_path / "sg.json")}).sample(3, seed=0)
