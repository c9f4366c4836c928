"""Multi-turn conversations played as sessions: a data set entry's `sessions` option, a session's turns, and the
history a later turn carries.

A session starts at an arrival (its first turn is the request a single-turn mix sends for that arrival, unchanged);
turn n+1 is sent `think_time_s` after turn n's answer ended, its prompt the conversation so far: the earlier user
turns and the answers the server actually sent (not the data set's replies, whose lengths only set each turn's
output length). So a server's prefix cache and the growing context are part of the rehearsal, as in a real chat.

What the history is on the wire: on the chat endpoint a messages list (user, assistant, user, ...); on the
completions endpoint one text, each user turn followed by its answer and SEPARATOR, the new turn last (the first
turn's prompt and answer are exactly what the engine saw and wrote, so a follow-up starts with both).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

# Turns a session may play, the first included: a later turn's request_index is laid out per session with this
# stride (turn_index), past every arrival's own index.
MAX_TURNS = 1024
FOLLOW_UP_BASE = 1 << 40  # later turns' request_index start here: no shape has this many arrivals
SEPARATOR = "\n\n"  # between an answer and the next user turn on the completions endpoint


class Sessions(BaseModel):
    """`sessions:` on a data set entry: play each conversation's later user turns (ShareGPT's later human turns,
    MT-Bench's and Spec-Bench's second turn) after the first, each after the previous answer plus a think time."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    think_time_s: float = Field(default=0.0, ge=0, description="after an answer ends, before the next turn is sent")
    max_turns: int | None = Field(
        default=None, ge=1, le=MAX_TURNS, description="turns played per conversation, the first included; default: all"
    )


@dataclass(frozen=True)
class Turn:
    """A later user turn as the data set has it: its text and the output length it asks for."""

    prompt: str
    prompt_tokens: int  # of the turn's own text (the history's tokens are the server's count of the previous turn)
    max_tokens: int


@dataclass(frozen=True)
class SessionTurn:
    """One turn of one session, as the worker sends it; `later` are the turns still to come."""

    session_id: int  # the request_index of the session's first turn (its arrival)
    turn: int  # 1 for the first
    user: str  # this turn's user text
    history: tuple[tuple[str, str], ...]  # the earlier turns: (user text, the answer the server sent)
    later: tuple[Turn, ...]
    think_time_s: float
    max_model_len: int | None = None  # the data set's (the engine's): a later turn longer than it is not sent

    @property
    def request_index(self) -> int:
        return turn_index(self.session_id, self.turn)

    def next(self, answer: str) -> SessionTurn:
        """The following turn, once this one's answer is known."""
        return SessionTurn(
            session_id=self.session_id, turn=self.turn + 1, user=self.later[0].prompt,
            history=(*self.history, (self.user, answer)), later=self.later[1:], think_time_s=self.think_time_s,
            max_model_len=self.max_model_len,
        )  # fmt: skip

    def messages(self) -> list[dict[str, str]]:
        """The chat endpoint's messages: every earlier exchange, then this turn."""
        out: list[dict[str, str]] = []
        for user, answer in self.history:
            out += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        return [*out, {"role": "user", "content": self.user}]

    def text(self) -> str:
        """The completions endpoint's prompt: each earlier turn and its answer, SEPARATOR, then this turn."""
        return "".join(user + answer + SEPARATOR for user, answer in self.history) + self.user


def first_turn(
    session_id: int, prompt: str, later: tuple[Turn, ...], think_time_s: float, max_model_len: int | None = None
) -> SessionTurn:
    return SessionTurn(
        session_id=session_id, turn=1, user=prompt, history=(), later=later, think_time_s=think_time_s,
        max_model_len=max_model_len,
    )  # fmt: skip


def turn_index(session_id: int, turn: int) -> int:
    """A turn's request_index: the first keeps its arrival's, a later one lies past every arrival, so request i of
    a (shape, repeat) still pairs across arms and every turn of every session is its own request."""
    if not 1 <= turn <= MAX_TURNS:
        raise ValueError(f"turn {turn} outside 1..{MAX_TURNS}")
    return session_id if turn == 1 else FOLLOW_UP_BASE + session_id * MAX_TURNS + turn - 1
