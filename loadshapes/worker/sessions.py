"""A session's next turn in the load worker: built once the previous turn's answer is in (its text is the
history's assistant turn, its usage the history's length), sent after the think time, unless that falls after
the shape's end. What is not sent is counted (the worker's summary), never a row: the arrivals are the sessions'
starts, and a later turn is load the conversation adds, not a request the shape scheduled."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from geventhttpclient._parser import HTTPParseError

from loadshapes.http_framing import decode_response
from loadshapes.mixes import RequestSpec
from loadshapes.plan import Planned, WorkerPlan, request_body
from loadshapes.sse import StreamError, StreamResult, answer_text, body_lines
from loadshapes.wire import Exchange


@dataclass
class TurnsNotSent:
    """Later turns of sessions that were not sent, by why (each counts every turn the session had left)."""

    after_end: int = 0  # the turn's time fell after the shape's end
    after_failure: int = 0  # the previous turn failed: the conversation has no answer to carry
    over_max_model_len: int = 0  # the history and the turn's output would not fit the engine's context
    at_stop: int = 0  # the worker stopped during the think time

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Answer:
    text: str
    prompt_tokens: int | None
    output_tokens: int | None


def answer_of(received: Exchange) -> Answer | None:
    """The answer of a complete, successful streamed response; None where the request failed in any way."""
    if received.failure is not None or received.broken is not None or received.done_ns is None:
        return None
    try:
        response = decode_response(received.chunks, received.times)
    except HTTPParseError:
        return None
    if response is None or response.status != 200:
        return None
    result = StreamResult()
    lines: list[bytes] = []
    try:
        for line, t_ns in body_lines(response.body, response.times):
            result.feed(line, t_ns)
            lines.append(line)
        result.check_complete()
    except StreamError:
        return None
    return Answer(answer_text(lines), result.prompt_tokens, result.output_tokens)


def next_request(plan: WorkerPlan, item: Planned, answer: Answer, offset_s: float) -> Planned:
    """The turn after `item` (which has one), carrying its history, to be sent at `offset_s` into the unit."""
    session = item.session
    assert session is not None and session.later, "a session turn with a turn after it"
    turn = session.next(answer.text)
    wanted = session.later[0]
    # The history's length as the server counted it (previous prompt and answer), plus the new user turn.
    history_tokens = (answer.prompt_tokens or item.spec.prompt_tokens) + (answer.output_tokens or 0)
    spec = RequestSpec(
        category=item.spec.category, prompt=turn.text(), prompt_tokens=history_tokens + wanted.prompt_tokens,
        max_tokens=wanted.max_tokens, output_tokens=wanted.max_tokens, ignore_eos=item.spec.ignore_eos,
    )  # fmt: skip
    if plan.shape.open_loop:
        phase, rate = str(plan.shape.phase_at(offset_s)), float(plan.shape.rate_at(offset_s))
    else:
        phase, rate = item.phase, None
    return Planned(turn.request_index, offset_s, phase, spec, request_body(plan, spec, turn), rate, turn)


def fits(item: Planned) -> bool:
    """Whether a later turn's history and output fit the data set's max_model_len (where it has one): a longer one
    would only be refused by the server. The history's tokens are the server's count of the previous turn, the new
    turn's as the first turns' are counted (the chat template's few tokens are not)."""
    limit = item.session.max_model_len if item.session is not None else None
    return limit is None or item.spec.prompt_tokens + item.spec.max_tokens <= limit
