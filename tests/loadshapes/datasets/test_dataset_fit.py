"""A data set under the engine's max_model_len: rows whose prompt + output exceed it are skipped in vLLM's order
(request k is the k-th row that fits), counted in the served model's tokens (words, said to be estimates, where
none is known), and said on the run's console, in its manifest and in summary.json's headline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from loadshapes.datasets.fit import fits, measure
from loadshapes.datasets.source import DatasetSource, Deck, judge
from loadshapes.mixes import RequestMix
from loadshapes.tokens import local_prompt_tokenizer
from orchestrator.cli import main
from tests.loadshapes.datasets import files
from tests.tiny_model import build_tiny_tokenizer

LIMIT = 64  # words: about half of files.sharegpt's pairs within vLLM's limits fit


def _words(text: str) -> int:
    return len(text.split())


def test_rows_over_max_model_len_are_skipped_in_vllms_order(tmp_path: Path) -> None:
    path = files.sharegpt(tmp_path / "sg.json")
    free = DatasetSource(dataset=str(path))
    bounded = DatasetSource(dataset=str(path), max_model_len=LIMIT)
    unbounded_deck, deck = Deck(free, 7, None), Deck(bounded, 7, None)
    # vLLM's order (its shuffle of the kept rows for seed 7), then the rows that fit, in that order.
    walk = [deck.rows.record(i) for i in deck.order]
    fitting = [r for r in walk if judge(bounded, r, _words)[1] is None]
    within_vllm = [r for r in walk if judge(free, r, _words)[1] is None]
    assert 0 < len(fitting) < len(within_vllm)
    for k, record in enumerate(fitting):
        got, prompt, output = deck.request(k)
        assert got == record and prompt + output <= LIMIT
    # Dropping changes request k: without a limit request k is vLLM's k-th pair within its own limits.
    assert [unbounded_deck.request(k)[0] for k in range(len(within_vllm))] == within_vllm
    assert [deck.request(k)[0] for k in range(len(fitting))] != within_vllm[: len(fitting)]

    fit = measure(bounded, None)
    over = sum(judge(bounded, r, _words)[1] == "max_model_len" for r in walk)
    assert (fit.rows, fit.sent, fit.too_long) == (len(walk), len(fitting), over)
    assert fit.vllm_limits == len(walk) - len(within_vllm)


def test_the_line_says_what_is_sent_whose_counts_and_where_outputs_come_from(tmp_path: Path) -> None:
    path = files.sharegpt(tmp_path / "sg.json")
    fit = measure(DatasetSource(dataset=str(path), max_model_len=LIMIT), None)
    assert fit.line() == (
        f"data set {path} (sharegpt): {fit.sent} of {fit.rows} rows sent, {fit.vllm_limits} outside vLLM's ShareGPT "
        f"limits, {fit.too_long} over max_model_len {LIMIT} (prompt + output); counted in words: no tokenizer known, "
        "so the lengths are estimates; output lengths from the data set (each reply's length)"
    )
    spec = files.spec_bench(tmp_path / "question.jsonl")
    (line,) = [f.line() for f in fits([DatasetSource(dataset=str(spec))], None)]
    assert line.endswith(
        "32 of 32 rows sent, none checked against max_model_len (none known); counted in words: no tokenizer "
        "known, so the lengths are estimates; output lengths not in the data set: 256 tokens each (spec_bench's "
        "default, vLLM's)"
    ), line
    custom = files.jsonl(tmp_path / "custom.jsonl", [
        {"prompt": "one two three", "output_tokens": 5}, {"prompt": "four five", "output_tokens": 9},
        {"prompt": "six seven eight nine"},
    ])  # fmt: skip
    line = measure(DatasetSource(dataset=str(custom), max_model_len=300), None).line()
    assert "3 of 3 rows sent, 0 over max_model_len 300" in line, line
    assert line.endswith("output lengths from the data set for 2 rows, 256 tokens (custom's default) for 1"), line


@pytest.mark.parametrize("style", ["byte-level", "metaspace"])
def test_counted_in_the_served_models_tokens(tmp_path: Path, style: str) -> None:
    """With the served model's tokenizer the rows are its counts (BOS included where the server adds one), the
    limit applied to them, and the line names it."""
    tokenizer = local_prompt_tokenizer(
        str(build_tiny_tokenizer(tmp_path / "tok", style=style)),  # type: ignore[arg-type]
        add_special_tokens=True,
    )
    path = files.sharegpt(tmp_path / "sg.json")
    source = DatasetSource(dataset=str(path), max_model_len=120)
    records = list(source.index().records())
    verdicts = [judge(source, r, tokenizer.count) for r in records]
    fit = measure(source, tokenizer)
    assert fit.sent == sum(why is None for _, why in verdicts)
    assert fit.too_long == sum(why == "max_model_len" for _, why in verdicts) > 0
    assert f"counted in {tokenizer.name}'s tokens;" in fit.line()
    assert fit.too_long != measure(source, None).too_long  # tokens, not words, were compared with the limit
    kept = RequestMix.model_validate({"datasets": [{"dataset": str(path), "max_model_len": 120}]}).sample(
        30, seed=0, tokenizer=tokenizer
    )
    assert all(r.prompt_tokens + r.max_tokens <= 120 for r in kept)
    assert all(r.prompt_tokens == tokenizer.count(r.prompt) for r in kept)


def test_the_run_says_it_on_the_console_and_in_summary_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The engine's max_model_len bounds the data set (the campaign fills it in); the line is printed before the
    answer, kept in the manifest and in summary.json's headline; the trace holds no request over the limit."""
    import pyarrow.dataset as ds

    path = files.sharegpt(tmp_path / "sg.json")
    campaign = tmp_path / "short-context.yaml"
    output = tmp_path / "run"
    campaign.write_text(yaml.safe_dump({
        "name": "fit", "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle", "max_model_len": LIMIT},
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "shapes": {"s": {"kind": "sustained", "rate": 5, "duration_s": 4}}, "mix": {"dataset": "sg.json"},
        "output": str(output),
    }))  # fmt: skip
    main(["simulate", str(campaign)])
    out = capsys.readouterr().out
    expected = measure(DatasetSource(dataset=str(path), max_model_len=LIMIT), None).line()
    assert f"{expected}\n" in out and out.index(expected) < out.index("answer ("), out
    assert json.loads((output / "manifest.json").read_text())["datasets"] == [expected]
    assert expected in json.loads((output / "summary.json").read_text())["headline"]
    rows = ds.dataset(output / "traces", format="parquet", partitioning="hive").to_table()
    lengths = [p + o for p, o in zip(rows["prompt_tokens"].to_pylist(), rows["output_tokens"].to_pylist(), strict=True)]
    assert lengths and max(lengths) <= LIMIT


def test_a_campaign_counts_in_its_endpoints_tokenizer_or_says_why_words(tmp_path: Path) -> None:
    """The campaign counts with the tokenizer its load workers get (an endpoint's `tokenizer`); one it cannot load
    here is named, and the counts are words (a real run refuses it before it deploys). `mix.max_model_len` bounds
    an endpoint's data set, whose engine says none."""
    from orchestrator.plan.campaign import Campaign

    path = files.sharegpt(tmp_path / "sg.json")
    tokenizer_dir = str(build_tiny_tokenizer(tmp_path / "tok"))

    def lines(tokenizer: str) -> list[str]:
        campaign = Campaign.model_validate({
            "name": "c", "policies": {"off": "off"}, "mix": {"dataset": str(path), "max_model_len": 120},
            "engine": {"kind": "endpoint", "model": "m", "urls": {"off-single": "http://127.0.0.1:1"},
                       "tokenizer": tokenizer},
        })  # fmt: skip
        return campaign.dataset_lines()

    (counted,) = lines(tokenizer_dir)
    tokenizer = local_prompt_tokenizer(tokenizer_dir, add_special_tokens=True)
    assert counted == measure(DatasetSource(dataset=str(path), max_model_len=120), tokenizer).line()
    assert f"counted in {tokenizer_dir}'s tokens" in counted
    (words,) = lines(str(tmp_path / "gone"))
    assert f"counted in words: engine.tokenizer {tmp_path / 'gone'} is not loadable here, so the lengths" in words
