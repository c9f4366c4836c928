"""Multi-turn sessions without a server: which turns a data set entry plays, the history a later turn carries on
each endpoint, the answer's text read from a stream, the request indices, old traces, the virtual-time refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from loadshapes.datasets.sampling import DatasetEntry, dataset_requests, dataset_sessions
from loadshapes.mixes import RequestMix
from loadshapes.plan import Target, WorkerPlan, open_loop_schedule
from loadshapes.sessions import FOLLOW_UP_BASE, SEPARATOR, Sessions, first_turn, turn_index
from loadshapes.shapes import Quiet
from loadshapes.sse import answer_text
from loadshapes.trace import FILE_SCHEMA, TRACE_SCHEMA, read_traces
from tests.loadshapes.datasets.files import jsonl, sharegpt


def _conversation(path: Path) -> Path:
    turns = [
        ("human", "Tell me about the sea and its waves"), ("gpt", "The sea is wide and deep " * 3),
        ("human", "And the tides?"), ("gpt", "They rise twice a day"),
        ("human", "Why?"), ("gpt", "The moon pulls the water"),
        ("human", "a last question nobody answered"),
    ]  # fmt: skip
    entry = {"id": "c", "conversations": [{"from": who, "value": text} for who, text in turns]}
    path.write_text(json.dumps([entry]))
    return path


def test_sharegpts_later_turns_are_the_sessions_turns_with_their_reply_lengths(tmp_path: Path) -> None:
    path = str(_conversation(tmp_path / "c.json"))
    entry = DatasetEntry(dataset=path, sessions=Sessions(think_time_s=2))
    [session] = dataset_sessions([entry], [0], seed=0, tokenizer=None)
    assert session is not None and session.turn == 1 and session.session_id == 0
    assert session.user == "Tell me about the sea and its waves" and session.think_time_s == 2
    # The human turns after the first, each asking its reply's length (words without a tokenizer); the last human
    # turn has no reply to take a length from: not played.
    assert [(t.prompt, t.max_tokens) for t in session.later] == [("And the tides?", 5), ("Why?", 5)]
    assert [t.prompt_tokens for t in session.later] == [3, 1]
    capped = DatasetEntry(dataset=path, sessions=Sessions(max_turns=2))
    [short] = dataset_sessions([capped], [0], seed=0, tokenizer=None)
    assert short is not None and [t.prompt for t in short.later] == ["And the tides?"]
    assert dataset_sessions([DatasetEntry(dataset=path)], [0], seed=0, tokenizer=None) == [None]


def test_a_sessions_first_turn_is_the_single_turn_request(tmp_path: Path) -> None:
    """Sessions add turns; request i itself (vLLM's) is unchanged, whatever the entry's option."""
    path = str(sharegpt(tmp_path / "s.json"))
    single = dataset_requests([DatasetEntry(dataset=path)], range(12), seed=3, tokenizer=None)
    played = DatasetEntry(dataset=path, sessions=Sessions())
    assert dataset_requests([played], range(12), seed=3, tokenizer=None) == single
    sessions = dataset_sessions([played], range(12), seed=3, tokenizer=None)
    assert [s.user if s else None for s in sessions] == [r["prompt"] for r in single]
    later = [[t.prompt for t in s.later] if s else None for s in sessions]
    assert set(map(tuple, later)) == {(), ("and then?",)} and later.count(["and then?"]) > 6  # type: ignore[arg-type]


def test_mt_benchs_second_turn_asks_the_formats_default_length(tmp_path: Path) -> None:
    rows = [{"question_id": i, "category": "writing", "turns": [f"first {i}", f"second {i}"]} for i in range(4)]
    path = str(jsonl(tmp_path / "mt.jsonl", rows))  # type: ignore[arg-type]
    entry = DatasetEntry(dataset=path, format="mt_bench", output_tokens=None, sessions=Sessions())
    sessions = dataset_sessions([entry], range(4), seed=0, tokenizer=None)
    for s in sessions:
        assert s is not None and len(s.later) == 1
        assert s.later[0].prompt == s.user.replace("first", "second") and s.later[0].max_tokens == 256
    fixed = DatasetEntry(dataset=path, format="mt_bench", output_tokens=7, sessions=Sessions())
    assert {s.later[0].max_tokens for s in dataset_sessions([fixed], range(4), 0, None) if s} == {7}


def test_a_later_turn_carries_the_history_with_the_answers_the_server_sent() -> None:
    from loadshapes.sessions import Turn

    later = (Turn("second", 1, 4), Turn("third", 1, 4))
    one = first_turn(5, "first", later, think_time_s=0.5)
    two = one.next("answer one")
    three = two.next("answer two")
    assert (two.turn, two.user, two.session_id, len(two.later)) == (2, "second", 5, 1)
    assert three.messages() == [
        {"role": "user", "content": "first"}, {"role": "assistant", "content": "answer one"},
        {"role": "user", "content": "second"}, {"role": "assistant", "content": "answer two"},
        {"role": "user", "content": "third"},
    ]  # fmt: skip
    # Completions: the first prompt and its answer as the engine saw and wrote them, then each later turn.
    assert three.text() == "first" + "answer one" + SEPARATOR + "second" + "answer two" + SEPARATOR + "third"
    assert one.text() == "first" and one.messages() == [{"role": "user", "content": "first"}]


def test_every_turn_has_its_own_request_index_and_the_first_keeps_its_arrivals() -> None:
    assert turn_index(7, 1) == 7
    indices = {turn_index(s, t) for s in range(50) for t in range(1, 30)}
    assert len(indices) == 50 * 29
    assert min(turn_index(s, t) for s in range(50) for t in range(2, 30)) >= FOLLOW_UP_BASE
    with pytest.raises(ValueError, match="outside"):
        turn_index(1, 0)


def test_the_answers_text_is_read_from_chat_and_completion_streams() -> None:
    chat = [
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}],"usage":{"completion_tokens":1}}',
        b"",
        b'data: {"choices":[{"index":0,"delta":{"content":"lo \\u00e9"}}]}',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}',
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}',
        b"data: [DONE]",
    ]
    assert answer_text(chat) == "Hello é"
    completions = [b'data: {"choices":[{"index":0,"text":" one"}]}', b'data: {"choices":[{"index":0,"text":" two"}]}']
    assert answer_text(completions) == " one two"


def test_a_plan_with_sessions_schedules_first_turns_only(tmp_path: Path) -> None:
    path = str(sharegpt(tmp_path / "s.json"))
    fields = {"campaign": "c", "run": "r", "arm": "a", "shape_name": "s", "shape": Quiet(rate=10, duration_s=2),
              "target": Target(base_url="http://127.0.0.1:1", model="m"),
              "trace_root": str(tmp_path / "t")}  # fmt: skip
    single = open_loop_schedule(WorkerPlan.model_validate({**fields, "mix": RequestMix(dataset=path)}))
    mix = RequestMix.model_validate({"dataset": path, "sessions": {"think_time_s": 1}})
    played = open_loop_schedule(WorkerPlan.model_validate({**fields, "mix": mix}))
    assert [(p.index, p.offset_s, p.body) for p in played] == [(p.index, p.offset_s, p.body) for p in single]
    assert all(p.session is not None and p.session.turn == 1 and p.session.session_id == p.index for p in played)
    assert all(p.session is None for p in single)


def test_a_trace_written_before_the_session_columns_reads_them_as_nulls(tmp_path: Path) -> None:
    old = pa.schema([f for f in FILE_SCHEMA if f.name not in ("session_id", "turn")], metadata=FILE_SCHEMA.metadata)
    row = {f.name: None for f in old}
    row.update(campaign="c", run="r", request_id="a:s:0:0", repeat=0, request_index=0, scheduled_ns=1, status="ok")
    directory = tmp_path / "traces" / "arm=a" / "shape=s"
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([row], schema=old), directory / "part-old.parquet")
    table = read_traces(str(tmp_path / "traces"))
    assert table.schema.names == TRACE_SCHEMA.names
    assert table.column("session_id").to_pylist() == [None] and table.column("turn").to_pylist() == [None]


def test_sessions_are_refused_in_virtual_time_in_one_line_with_nothing_written(tmp_path: Path) -> None:
    from orchestrator.cli import cli

    path = sharegpt(tmp_path / "s.json")
    campaign = {
        "name": "sessions", "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off"}, "topologies": {"single": "single"},
        "mix": {"dataset": str(path), "sessions": {"think_time_s": 1}},
        "shapes": {"s": {"kind": "sustained", "rate": 2.0, "duration_s": 5}}, "output": str(tmp_path / "out"),
    }  # fmt: skip
    (tmp_path / "c.json").write_text(json.dumps(campaign))
    result = CliRunner().invoke(cli, ["simulate", str(tmp_path / "c.json")])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "sessions" in line]
    assert len(errors) == 1 and "cannot run in virtual time" in errors[0]
    assert not (tmp_path / "out").exists()


def test_a_later_turns_body_is_built_from_the_received_answer(tmp_path: Path) -> None:
    """The worker's step between two turns: the raw response decoded, its text and usage into the next body."""
    from loadshapes.wire import Exchange
    from loadshapes.worker.sessions import Answer, answer_of, fits, next_request

    path = str(_conversation(tmp_path / "c.json"))
    fields = {"campaign": "c", "run": "r", "arm": "a", "shape_name": "s", "shape": Quiet(rate=10, duration_s=9),
              "target": Target(base_url="http://127.0.0.1:1", model="m", endpoint="chat"),
              "trace_root": str(tmp_path / "t"), "mix": {"dataset": path, "sessions": {}}}  # fmt: skip
    plan = WorkerPlan.model_validate(fields)
    item = open_loop_schedule(plan)[0]
    events = [
        {"choices": [{"index": 0, "delta": {"content": piece}}], "usage": {"prompt_tokens": 9, "completion_tokens": n}}
        for n, piece in ((1, "Waves "), (2, "roll."))
    ]
    events.append({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    raw = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body.encode())}\r\n\r\n{body}".encode()
    received = Exchange(request=b"", chunks=[raw[:50], raw[50:]], times=[1, 2], done_ns=2)
    answer = answer_of(received)
    assert answer is not None and (answer.text, answer.prompt_tokens, answer.output_tokens) == ("Waves roll.", 9, 2)
    follow = next_request(plan, item, answer, offset_s=3.0)
    sent = json.loads(follow.body)
    assert sent["messages"] == [
        {"role": "user", "content": "Tell me about the sea and its waves"},
        {"role": "assistant", "content": "Waves roll."}, {"role": "user", "content": "And the tides?"},
    ]  # fmt: skip
    assert sent["max_tokens"] == 5 and sent["specdrill"]["prompt_tokens"] == 9 + 2 + 3
    assert (follow.index, follow.session and follow.session.turn, follow.offset_s) == (turn_index(0, 2), 2, 3.0)
    assert fits(follow)  # no max_model_len known
    # The data set's max_model_len (the engine's): a history of 30 + 2 tokens (the server's count), the new turn (3
    # words) and its 5 output tokens make 40 (the first turn, 7 + 18 words, fits either limit).
    longer = Answer(answer.text, prompt_tokens=30, output_tokens=2)
    for limit, fit in ((40, True), (39, False)):
        bounded = plan.model_copy(update={"mix": plan.mix.within(limit)})
        follow = next_request(bounded, open_loop_schedule(bounded)[0], longer, offset_s=3.0)
        assert fits(follow) is fit
    failed = Exchange(request=b"", chunks=[b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"], times=[1], done_ns=1)
    assert answer_of(failed) is None


def test_sessions_under_a_replay_with_recorded_lengths_are_refused_in_one_line(tmp_path: Path) -> None:
    """A trace that records its requests' lengths is sent request for request: sessions would silently not play."""
    from orchestrator.cli import cli
    from tests import REPO

    path = sharegpt(tmp_path / "s.json")
    replay = {"kind": "replay", "path": str(REPO / "examples" / "burstgpt-sample.csv"), "format": "burstgpt",
              "start_s": 50, "duration_s": 30}  # fmt: skip
    campaign = {
        "name": "sessions", "engine": {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"},
        "policies": {"off": "off"}, "topologies": {"single": "single"},
        "mix": {"dataset": str(path), "sessions": {"think_time_s": 1}},
        "shapes": {"bursty": replay}, "output": str(tmp_path / "out"),
    }  # fmt: skip
    (tmp_path / "c.json").write_text(json.dumps(campaign))
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "c.json")])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "sessions" in line]
    assert len(errors) == 1 and "bursty replays a trace with its requests' lengths" in errors[0], result.output
    assert not (tmp_path / "out").exists()
