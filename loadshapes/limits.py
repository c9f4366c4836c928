"""How big a run specdrill agrees to plan before it writes anything: limits an operator raises with
`--limit NAME=VALUE` (docs/reference/campaign-reference.md, "Limits").

The defaults keep any input reachable from a file within a few GiB of memory on a small machine (a 24 GiB
workstation): beyond them a command refuses in one line with the figures, and the operator who means it raises the
limit. They live here, below the orchestrator, because the replay readers (loadshapes/replay_formats/) enforce
two of them while they stream a file, before the campaign's plan can be sized at all.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Limits(BaseModel):
    """Before anything is written, `run`, `simulate`, `search` and `tune` size the plan without building it:
    requests from the shapes' integrals (rate x duration; a replay window's count; a closed loop's users served
    back to back at the engine's fastest step, or at 1 ms a request where the mix can ask for more than
    max_model_len), tokens from the mix's `high` bounds (or the replay window's recorded lengths), memory and time
    from costs measured on the simulator. A figure over its limit refuses the run in
    one line with every figure and the flag that raises it (`planned run too large: 5,184,000 requests, over the
    limit of 5,000,000 (limit requests; raise it with --limit requests=5200000): ...`), exit 2, nothing written.
    Replay files are read a bounded line at a time and a window's rows counted as they stream: a longer line or
    more rows is one line naming the file (and line). Raise a limit per command (`run`, `simulate`, `search`,
    `tune`): `specdrill simulate CAMPAIGN.yaml --limit requests=2e7 --limit memory_gib=16`. The defaults keep any
    campaign within a few GiB on a 24 GiB machine; the memory estimate is an upper bound of the measured peak RSS
    (a run planned just under a lowered memory limit stays under it).
    Valid settings that cannot mean what they say are run with a one-line warning: an SLO deadline below the
    simulated engine's fastest step (TTFT, end-to-end) or its fastest token (TPOT, every draft accepted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Requests the whole run sends, every arm and unit counted.
    requests: float = Field(default=5_000_000, gt=0)
    # Prompt plus output tokens of one request (a replayed row, a mix's `high`): the prompt text is built.
    request_tokens: float = Field(default=1_048_576, gt=0)
    # Arms x shapes x repeats.
    units: float = Field(default=2000, gt=0)
    # The planned run's estimated peak memory (one unit's traffic held at once; tune holds all of them).
    memory_gib: float = Field(default=4, gt=0)
    # The planned run's estimated duration: wall-clock seconds of its shapes in real time, the simulator's cost
    # per request in virtual time.
    hours: float = Field(default=24, gt=0)
    # Rows a replay window keeps from its files (read before anything is scaled: ~60 bytes a row).
    replay_rows: float = Field(default=20_000_000, gt=0)
    # The longest line of a replay file (CSV or JSONL), in KiB: a line is parsed whole.
    line_kib: float = Field(default=1024, gt=0)

    @property
    def line_bytes(self) -> int:
        return int(min(self.line_kib * 1024, 2**31 - 1))


DEFAULT = Limits()
_CURRENT: contextvars.ContextVar[Limits] = contextvars.ContextVar("specdrill_limits", default=DEFAULT)


class LimitSyntaxError(ValueError):
    pass


def current() -> Limits:
    return _CURRENT.get()


current_limits = current  # for modules with a `limits` field of their own


def set_limits(limits: Limits) -> None:
    """The limits for the rest of this command (the CLI sets them from its `--limit` flags)."""
    _CURRENT.set(limits)


@contextmanager
def using(limits: Limits) -> Iterator[None]:
    token = _CURRENT.set(limits)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def parse_limits(items: tuple[str, ...] | list[str], base: Limits = DEFAULT) -> Limits:
    """`NAME=VALUE` pairs (requests=2e7, memory_gib=16) over `base`; one line naming the bad pair otherwise."""
    names = ", ".join(Limits.model_fields)
    update: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in Limits.model_fields:
            raise LimitSyntaxError(f"--limit {item!r}: expected NAME=VALUE with NAME one of {names}")
        try:
            number = float(value)
        except ValueError:
            raise LimitSyntaxError(f"--limit {item!r}: {value!r} is not a number") from None
        if not (math.isfinite(number) and number > 0):
            raise LimitSyntaxError(f"--limit {item!r}: a limit is a finite number > 0")
        update[name] = number
    try:
        return Limits.model_validate({**base.model_dump(), **update})
    except ValidationError as exc:  # pragma: no cover - every field is a positive float, checked above
        raise LimitSyntaxError(str(exc.errors()[0]["msg"])) from None


def figure(value: float) -> str:
    """A count for a message: 2.5e+07 reads as 25,000,000; inf as such."""
    if not math.isfinite(value):
        return "unbounded"
    if value >= 1e15:
        return f"{value:.3g}"
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}"


def raise_hint(name: str, needed: float) -> str:
    """How the operator who means it raises the limit."""
    wanted = needed if math.isfinite(needed) else getattr(current(), name) * 10
    return f"--limit {name}={_round_up(wanted)}"


def _round_up(value: float) -> str:
    """Two significant digits, rounded up, so the suggested limit admits the figure."""
    if value <= 0:
        return "1"
    exponent = math.floor(math.log10(value)) - 1
    step = 10.0**exponent
    up = math.ceil(value / step - 1e-9) * step
    return f"{up:.0f}" if up >= 1 else f"{up:.2g}"
