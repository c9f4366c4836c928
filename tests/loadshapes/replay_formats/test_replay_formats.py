"""Replaying public LLM traces (Azure, BurstGPT, Mooncake) with their request lengths, on small files written here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from loadshapes import replayed
from loadshapes.arrivals import shape_arrivals
from loadshapes.mixes import RequestMix
from loadshapes.plan import Target, WorkerPlan, open_loop_schedule
from loadshapes.replay_formats import csv_traces, registry, streaming
from loadshapes.replay_formats.base import Format
from loadshapes.replay_formats.streaming import StreamedFormat
from loadshapes.replayed import CategoryRule
from loadshapes.shapes import Replay

MIX = RequestMix.model_validate({"entries": [{"workload": "chat", "weight": 3}, {"workload": "editing", "weight": 1}]})
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def burstgpt(path: Path, rows: list[tuple[float, str, int, int]]) -> str:
    lines = [f"{t},{m},{p},{r},{p + r},{'Conversation log' if i % 2 else 'API log'}" for i, (t, m, p, r) in
             enumerate(rows)]  # fmt: skip
    path.write_text(BURSTGPT_HEADER + "\n".join(lines) + "\n")
    return str(path)


def azure(path: Path, rows: list[tuple[str, int, int]]) -> str:
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},{p},{g}\n" for t, p, g in rows))
    return str(path)


def mooncake(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def plan_for(shape: Replay, worker: int = 0, workers: int = 1, arm: str = "off") -> WorkerPlan:
    return WorkerPlan(
        campaign="c", run="r", arm=arm, shape_name="replay", shape=shape, mix=MIX, seed=7, worker=worker,
        workers=workers, target=Target(base_url="http://127.0.0.1:1", model="m"), trace_root="/tmp/unused",
    )  # fmt: skip


def test_azure_2023_and_2024_date_times_lengths_and_a_rule_by_file(tmp_path: Path) -> None:
    code = azure(tmp_path / "AzureLLMInferenceTrace_code.csv", [
        ("2023-11-16 18:15:46.6805900", 374, 44), ("2023-11-16 18:15:50.9951690", 396, 109),
        ("2023-11-16 18:15:51.0000000", 879, 31),
    ])  # fmt: skip
    shape = Replay(path=code, category=CategoryRule(by="file", map={"code": "editing", "conv": "chat"}))
    assert shape.trace_format == "azure" and shape.has_lengths
    np.testing.assert_allclose(shape.offsets(), [0.0, 4.314579, 4.319410])
    recorded = shape.requests(np.arange(3))
    assert recorded.prompt_tokens.tolist() == [374, 396, 879] and recorded.output_tokens.tolist() == [44, 109, 31]
    assert recorded.categories == ["editing"] * 3
    conv = azure(tmp_path / "AzureLLMInferenceTrace_conv_1week.csv", [
        ("2024-05-10 00:00:00.009930+00:00", 4808, 10), ("2024-05-10 00:00:02.509930+00:00", 3180, 8),
        ("2024-05-10 00:00:03", 100, 1),  # the 2024 files mix date-times without a zone into the rest
    ])  # fmt: skip
    week = Replay(path=conv, category=CategoryRule(by="file", map={"code": "editing", "conv": "chat"}), speed=2)
    np.testing.assert_allclose(week.offsets(), [0.0, 1.25, 1.495035])
    specs = open_loop_schedule(plan_for(week))
    assert [(s.spec.category, s.spec.prompt_tokens, s.spec.max_tokens) for s in specs] == [
        ("chat", 4808, 10), ("chat", 3180, 8), ("chat", 100, 1),
    ]  # fmt: skip
    assert all(s.spec.ignore_eos and len(s.spec.prompt.split()) == s.spec.prompt_tokens for s in specs)
    body = json.loads(specs[0].body)
    assert body["max_tokens"] == 10 and body["ignore_eos"] is True and body["specdrill"]["prompt_tokens"] == 4808


def test_burstgpt_failed_requests_skipped_or_kept_expecting_an_error(tmp_path: Path) -> None:
    path = burstgpt(tmp_path / "BurstGPT_1.csv", [
        (5.0, "ChatGPT", 472, 18), (45.0, "ChatGPT", 1087, 0), (118.0, "GPT-4", 417, 150), (140.0, "ChatGPT", 20, 3),
    ])  # fmt: skip
    rule = CategoryRule(by="model", map={"GPT-4": "reasoning"}, default="chat")
    skipped = Replay(path=path, category=rule)
    assert skipped.trace_format == "burstgpt"
    np.testing.assert_allclose(skipped.offsets(), [0.0, 113.0, 135.0])  # the trace starts at its first request
    recorded = skipped.requests(np.arange(3))
    assert recorded.categories == ["chat", "reasoning", "chat"] and recorded.prompt_tokens.tolist() == [472, 417, 20]
    kept = Replay(path=path, category=rule, failed="expect_error")
    np.testing.assert_allclose(kept.offsets(), [0.0, 40.0, 113.0, 135.0])
    specs = [p.spec for p in open_loop_schedule(plan_for(kept))]
    assert [s.expect_error for s in specs] == [False, True, False, False]
    failed = specs[1]
    assert failed.category == "failed" and failed.max_tokens == 0 and not failed.ignore_eos
    assert failed.prompt_tokens == 1087  # its arrival and prompt are replayed; the server refuses max_tokens 0
    by_log = Replay(path=path, category=CategoryRule(by="log_type", map={"API log": "editing"}))
    assert by_log.requests(np.arange(3)).categories == ["editing", "editing", None]  # None: the mix draws it


def test_mooncake_requests_sharing_leading_hash_ids_share_that_prefix(tmp_path: Path) -> None:
    path = mooncake(tmp_path / "trace.jsonl", [
        {"timestamp": 0, "input_length": 48, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 1500, "input_length": 44, "output_length": 9, "hash_ids": [0, 1, 7]},
        {"timestamp": 1500, "input_length": 18, "output_length": 2, "hash_ids": [3, 4]},
        {"timestamp": 4000, "input_length": 48, "output_length": 5, "hash_ids": [0, 1, 2]},
    ])  # fmt: skip
    shape = Replay(path=path, block_tokens=16, category="chat")
    assert shape.trace_format == "mooncake"
    np.testing.assert_allclose(shape.offsets(), [0.0, 1.5, 1.5, 4.0])
    specs = [p.spec for p in open_loop_schedule(plan_for(shape))]
    words = [s.prompt.split() for s in specs]
    assert [len(w) for w in words] == [48, 44, 18, 48] and [s.max_tokens for s in specs] == [5, 9, 2, 5]
    assert words[0][:32] == words[1][:32] and words[0][32:44] != words[1][32:]  # two shared blocks, then not
    assert words[0][:16] != words[2][:16]
    assert words[0] == words[3]  # the same hash ids: the same prompt, as in the trace
    doubled = Replay(path=path, block_tokens=16, category="chat", rate_scale=2.0)
    specs2 = [p.spec for p in open_loop_schedule(plan_for(doubled))]
    copies = [s.prompt.split() for s in specs2[:2]]  # request 0 and its copy
    assert copies[0][:32] == copies[1][:32] and copies[0][32:] != copies[1][32:]  # a copy's last block is its own


def test_window_speed_and_early_stop_in_a_file_in_time_order(tmp_path: Path) -> None:
    rows = [(float(t), "ChatGPT", 10 + t, 5) for t in range(100)]
    path = tmp_path / "b.csv"
    burstgpt(path, rows)
    with path.open("a") as handle:
        handle.write("100,ChatGPT,oops,5,5,API log\n")  # a bad row after the window
    window = Replay(path=str(path), start_s=20, duration_s=10, speed=2)
    np.testing.assert_allclose(window.offsets(), np.arange(10) / 2)  # from the window's start, twice as fast
    assert window.duration == pytest.approx(5.0)
    assert window.requests(np.arange(10)).prompt_tokens.tolist() == list(range(30, 40))
    with pytest.raises(ValidationError, match=r"b\.csv:102: Request tokens: 'oops' is not a whole number of tokens"):
        Replay(path=str(path), start_s=20)  # to the end: the bad row is read, and named
    with pytest.raises(ValidationError, match=r"b\.csv: no arrivals in the window \[200, 210\) s"):
        Replay(path=str(path), start_s=200, duration_s=10)


def test_a_worker_reads_only_the_lengths_of_its_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = burstgpt(tmp_path / "b.csv", [(t * 0.1, "ChatGPT", 100 + t, 1 + t) for t in range(200)])
    shape = Replay(path=path)
    converted: list[int] = []
    original = streaming.contents_columns

    def counting(path: str, fmt: StreamedFormat, batch: Any) -> dict[str, Any]:
        converted.append(batch.num_rows)
        return original(path, fmt, batch)

    monkeypatch.setattr(streaming, "contents_columns", counting)
    mine = open_loop_schedule(plan_for(shape, worker=1, workers=4))
    assert [p.index for p in mine] == list(range(1, 200, 4)) and sum(converted) == 50
    assert [p.spec.prompt_tokens for p in mine] == [100 + i for i in range(1, 200, 4)]


def test_request_i_is_identical_across_arms_and_worker_splits(tmp_path: Path) -> None:
    times = np.cumsum(np.random.default_rng(3).exponential(0.2, 60))
    path = burstgpt(tmp_path / "b.csv", [(float(t), "GPT-4" if i % 3 else "ChatGPT", 50 + i, 1 + i % 7)
                                         for i, t in enumerate(times)])  # fmt: skip
    shape = Replay(path=path, rate_scale=1.7, seed=4)

    def by_index(workers: int, arm: str) -> dict[int, tuple[float, bytes]]:
        return {
            p.index: (p.offset_s, p.body)
            for w in range(workers)
            for p in open_loop_schedule(plan_for(shape, worker=w, workers=workers, arm=arm))
        }

    one = by_index(1, "off")
    assert len(one) == shape.expected_requests
    assert by_index(3, "off") == one and by_index(5, "dyn") == one


def test_rate_scale_thins_and_replicates_keeping_the_bursts(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rate = np.where((np.arange(60) // 10) % 2 == 1, 40.0, 4.0)  # 10 s quiet, 10 s burst, ...
    times = np.concatenate([s + np.sort(rng.uniform(0, 1, rng.poisson(r))) for s, r in enumerate(rate)])
    path = tmp_path / "times.csv"
    path.write_text("\n".join(f"{t:.6f}" for t in times))
    recorded = np.histogram(Replay(path=str(path), duration_s=60).offsets(), bins=6, range=(0, 60))[0]
    for factor in (0.3, 2.5):
        shape = Replay(path=str(path), duration_s=60, rate_scale=factor, seed=1)
        offsets = shape.offsets()
        assert np.all(np.diff(offsets) >= 0)
        assert len(offsets) == pytest.approx(factor * len(times), rel=0.1)
        counts = np.histogram(offsets, bins=6, range=(0, 60))[0]
        np.testing.assert_allclose(counts, factor * recorded, rtol=0.25)  # every burst scaled, none smeared
        assert np.array_equal(offsets, Replay(path=str(path), duration_s=60, rate_scale=factor, seed=1).offsets())
    reseeded = Replay(path=str(path), duration_s=60, rate_scale=0.3, seed=2).offsets()
    assert not np.array_equal(reseeded, Replay(path=str(path), duration_s=60, rate_scale=0.3, seed=1).offsets())
    target = Replay(path=str(path), duration_s=60, target_rate=10.0, speed=2)
    assert len(target.offsets()) / target.duration == pytest.approx(10.0, rel=0.1)
    np.testing.assert_array_equal(shape_arrivals(target, seed=9), target.offsets())


def test_a_file_out_of_time_order_is_sorted_and_its_window_cut_after(tmp_path: Path) -> None:
    path = burstgpt(tmp_path / "b.csv", [(30.0, "ChatGPT", 3, 1), (10.0, "ChatGPT", 1, 1), (20.0, "GPT-4", 2, 0),
                                         (25.0, "GPT-4", 4, 1)])  # fmt: skip
    shape = Replay(path=path, start_s=12)  # the failed request at 20 s is skipped; the trace still starts at 10 s
    np.testing.assert_allclose(shape.offsets(), [3.0, 8.0])
    assert shape.requests(np.arange(2)).prompt_tokens.tolist() == [4, 3]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("b.csv", BURSTGPT_HEADER + "0,ChatGPT,1,2,3,API log\n\n1,GPT-4,5,-1,4,API log\n",
         r"b\.csv:4: Response tokens: '-1' is negative"),
        ("b.csv", BURSTGPT_HEADER + "0,ChatGPT,1,2,3,API log\nsoon,ChatGPT,1,2,3,API log\n",
         r"b\.csv:3: Timestamp: 'soon' is not a number of seconds"),
        ("b.csv", BURSTGPT_HEADER + "0,ChatGPT,1,2,3\n", r"b\.csv:2: expected 6 fields, got 5"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,2\n2023-13-40 00:00:00,1,1\n",
         r"a\.csv:3: TIMESTAMP: '2023-13-40 00:00:00' is not a date-time"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,\n",
         r"a\.csv:2: GeneratedTokens: '' is not a whole number of tokens"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n',
         r"m\.jsonl:2: input_length: None is not a whole number of tokens >= 0"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"timestamp": \n',
         r"m\.jsonl:2: not JSON: Expecting value"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, -2]}\n',
         r"m\.jsonl:1: hash_ids: \[1, -2\] is not a list of integers >= 0"),
    ],
)  # fmt: skip
def test_a_bad_row_is_named_by_file_line_and_field(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ValidationError, match=message) as caught:
        shape = Replay(path=str(tmp_path / name))
        shape.requests(np.arange(len(shape.offsets())))  # lengths are read (and checked) in the second pass
    assert len(str(caught.value.errors()[0]["msg"]).splitlines()) == 1


def test_named_formats_and_rules_are_checked_against_the_file(tmp_path: Path) -> None:
    path = burstgpt(tmp_path / "b.csv", [(0.0, "ChatGPT", 1, 1), (1.0, "ChatGPT", 1, 1)])
    with pytest.raises(ValidationError, match=r"b\.csv:1: no column 'TIMESTAMP' in the header \(Timestamp, Model"):
        Replay(path=path, format="azure")
    with pytest.raises(ValidationError, match="rate_scale and target_rate both scale the rate: give one"):
        Replay(path=path, rate_scale=2, target_rate=3)
    times = tmp_path / "t.csv"
    times.write_text("0\n1\n")
    with pytest.raises(ValidationError, match=r"t\.csv: category applies to traces with request lengths .* not csv"):
        Replay(path=str(times), category="chat")
    az = azure(tmp_path / "a.csv", [("2023-11-16 18:15:46", 1, 1)])
    with pytest.raises(ValidationError, match=r"a\.csv: failed applies to BurstGPT traces \(0 response tokens\)"):
        Replay(path=az, failed="expect_error")
    with pytest.raises(ValidationError, match=r"a\.csv: category by 'model': a azure trace has file"):
        Replay(path=az, category=CategoryRule(by="model", map={"x": "chat"}))
    clipped = Replay(path=path, max_prompt_tokens=1, max_output_tokens=1, format="burstgpt")
    assert clipped.requests(np.arange(2)).output_tokens.tolist() == [1, 1]
    assert Replay(path=str(times), format="csv").has_lengths is False


def test_a_named_column_reads_any_csv_as_timestamps_as_before(tmp_path: Path) -> None:
    path = burstgpt(tmp_path / "b.csv", [(3.0, "ChatGPT", 1, 1), (5.0, "GPT-4", 2, 0)])
    shape = Replay(path=path, column="Timestamp")  # failed rows too: a timestamp CSV knows nothing of them
    assert shape.trace_format == "csv" and not shape.has_lengths
    np.testing.assert_allclose(shape.offsets(), [0.0, 2.0])
    with pytest.raises(ValueError, match=r"b\.csv: a csv trace records arrival times only, no lengths"):
        shape.requests(np.arange(2))
    specs = [p.spec for p in open_loop_schedule(plan_for(shape))]
    assert {s.category for s in specs} <= {"chat", "editing"} and not any(s.expect_error for s in specs)


def test_a_late_row_out_of_order_moves_the_window_of_a_file_read_in_blocks(tmp_path: Path) -> None:
    rows = [(100 + i / 100, "ChatGPT", 1 + i % 50, 1) for i in range(20_000)] + [(0.0, "ChatGPT", 7, 1)]
    path = burstgpt(tmp_path / "b.csv", rows)
    assert Path(path).stat().st_size > 2 * csv_traces.CSV_BLOCK_BYTES  # the late row is in a later block
    shape = Replay(path=path, start_s=150, duration_s=10)  # the trace starts at 0 s (its last row), not 100 s
    np.testing.assert_allclose(shape.offsets(), np.arange(1000) / 100, atol=1e-9)
    assert shape.requests(np.array([0, 999])).prompt_tokens.tolist() == [1 + 5000 % 50, 1 + 5999 % 50]


def test_azure_code_and_conversation_files_replay_as_one_trace(tmp_path: Path) -> None:
    code = azure(tmp_path / "AzureLLMInferenceTrace_code.csv", [
        ("2023-11-16 18:15:47", 300, 30), ("2023-11-16 18:15:49", 301, 31), ("2023-11-16 18:15:55", 302, 32),
    ])  # fmt: skip
    conv = azure(tmp_path / "AzureLLMInferenceTrace_conv.csv", [
        ("2023-11-16 18:15:46", 100, 10), ("2023-11-16 18:15:48", 101, 11), ("2023-11-16 18:15:49", 102, 12),
    ])  # fmt: skip
    rule = CategoryRule(by="file", map={"code": "editing", "conv": "chat"})
    shape = Replay.model_validate({"kind": "replay", "path": [code, conv], "category": rule, "start_s": 1})
    assert shape.paths == (code, conv) and shape.trace_format == "azure"
    np.testing.assert_allclose(shape.offsets(), [0.0, 1.0, 2.0, 2.0, 8.0])  # from 18:15:47, the window's start
    recorded = shape.requests(np.arange(5))
    assert recorded.prompt_tokens.tolist() == [300, 101, 301, 102, 302]  # a tie keeps the order the paths are named
    assert recorded.categories == ["editing", "chat", "editing", "chat", "editing"]
    times = tmp_path / "t.csv"
    times.write_text("0\n")
    with pytest.raises(ValidationError, match=r"AzureLLMInferenceTrace_code\.csv is azure but .*t\.csv is csv"):
        Replay.model_validate({"kind": "replay", "path": [code, str(times)]})
    with pytest.raises(ValidationError, match=r"t\.csv, .*t\.csv: a csv trace is one file or trace directory"):
        Replay.model_validate({"kind": "replay", "path": [str(times), str(times)]})


@given(
    st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=60),
    st.floats(0.05, 6.0),
    st.integers(0, 2**32),
)
@settings(max_examples=200, deadline=None)
def test_scaling_keeps_order_and_lands_copies_before_the_next_arrival(times: list[float], factor: float,
                                                                        seed: int) -> None:  # fmt: skip
    recorded = np.sort(np.array(times))
    end = float(recorded[-1]) + 1.0
    offsets, source, copy = replayed.scaled(recorded, end, factor, seed)
    assert np.all(np.diff(offsets) >= 0) and np.all(np.diff(source) >= 0)
    nxt = np.append(recorded[1:], end)
    assert np.all(offsets >= recorded[source]) and np.all(offsets <= nxt[source])
    assert np.all(offsets[copy == 0] == recorded[source[copy == 0]])  # the recorded request keeps its time
    counts = np.bincount(source, minlength=len(recorded))
    assert set(counts.tolist()) <= {int(factor), int(factor) + 1}
    np.testing.assert_array_equal(copy, np.concatenate([np.arange(c) for c in counts]).astype(np.int64))
    again = replayed.scaled(recorded, end, factor, seed)
    assert all(np.array_equal(a, b) for a, b in zip((offsets, source, copy), again, strict=True))


def test_each_format_name_is_one_module_in_the_registry_and_the_csv_fallback_is_asked_last() -> None:
    assert sorted(registry.FORMATS) == sorted(get_args(Format))
    assert all(spec.name == name for name, spec in registry.FORMATS.items())
    assert list(registry.FORMATS)[-1] == "csv"  # it takes any file, so it is asked after the others
    assert {name for name, spec in registry.FORMATS.items() if spec.has_lengths} == {"azure", "burstgpt", "mooncake"}
