"""What `specdrill run` and `specdrill simulate` say while a campaign runs: a line per unit started and finished,
a line per unit a resumed run skips, and, when stopped by a signal, how far it got and the command that resumes.
The words only; the commands print them (orchestrator.cli)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.rundir.layout import Unit, UnitResult


def unit_line(unit: Unit, result: UnitResult | None, n: int, total: int, *, virtual: bool = False) -> str:
    """One line for a unit started (result None) or finished."""
    where = f"unit {n}/{total} arm={unit.arm} shape={unit.shape} repeat={unit.repeat}"
    if result is None:
        return f"{where} started"
    statuses = result.statuses
    ok = statuses.get("ok", 0)
    errors = sum(statuses.values()) - ok
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()) if k != "ok")
    tpot = "-" if result.tpot_p50_s is None else f"{result.tpot_p50_s * 1000:.1f}ms"
    took = f"{(result.end_ns - result.start_ns) / 1e9:.1f}s"
    parts = [
        f"{where} finished:",
        f"requests={result.scheduled}",
        f"ok={ok}",
        f"errors={errors}" + (f" ({kinds})" if errors else ""),
        f"tpot_p50={tpot}",
        f"send_lateness_p99={result.lateness_p99_s * 1000:.1f}ms",
        f"saturated={'yes' if result.saturated else 'no'}",
        f"took={took} of virtual time" if virtual else f"took={took}",
    ]
    if result.engine_lag_p99_s is not None:
        parts.insert(-1, f"engine_lag_p99={result.engine_lag_p99_s * 1000:.1f}ms")
        parts.insert(-1, f"engine_lag_share={result.engine_lag_share or 0.0:.0%}")
        parts.insert(-1, f"engine_lagged={'yes' if result.engine_lagged else 'no'}")
    if result.missing:
        parts.append(f"missing={result.missing}" + (" (a load worker was lost)" if result.incomplete else ""))
    parts += session_turns(result)
    return " ".join(parts)


def session_turns(result: UnitResult) -> list[str]:
    """Multi-turn sessions' later turns: how many were sent (rows among `requests`) and how many not, by why."""
    sent = sum(w.session_turns_sent for w in result.workers)
    not_sent: dict[str, int] = {}
    for worker in result.workers:
        for why, n in worker.session_turns_not_sent.items():
            not_sent[why] = not_sent.get(why, 0) + n
    if not sent and not any(not_sent.values()):
        return []
    whys = ", ".join(f"{why} {n}" for why, n in sorted(not_sent.items()) if n)
    return [
        f"session_turns_sent={sent}",
        f"session_turns_not_sent={sum(not_sent.values())}" + (f" ({whys})" if whys else ""),
    ]


def resume_command(command: str, campaign_file: str, options: Sequence[tuple[str, str | int | bool | None]]) -> str:
    """The command line that reruns the campaign into the same run directory: the options as given (a flag when
    True, left out when None or False), quoted for a POSIX shell."""
    words = ["specdrill", command, campaign_file]
    for name, value in options:
        if value is True:
            words.append(name)
        elif value is not None and value is not False:
            words += [name, str(value)]
    return shlex.join(words)


@dataclass
class CampaignProgress:
    """The state behind the lines: which units were complete before this run, which one is in flight."""

    name: str
    output: str
    units: list[Unit]
    complete_before: list[Unit]
    virtual: bool = False
    started: int = field(init=False)
    in_flight: Unit | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.started = len(self.complete_before)  # a resumed run numbers its units after the ones it skips

    def resumed_lines(self) -> list[str]:
        """Said once the run directory was accepted (a refused one is not being resumed)."""
        if not self.complete_before:
            return []
        total = len(self.units)
        head = (
            f"campaign {self.name}: resuming in {self.output}: {len(self.complete_before)} of {total} units already "
            f"complete, {total - len(self.complete_before)} to run"
        )
        skipped = [
            f"unit arm={u.arm} shape={u.shape} repeat={u.repeat} skipped: already complete"
            for u in self.complete_before
        ]
        return [head, *skipped]

    def unit_event(self, unit: Unit, event: str, result: UnitResult | None) -> str:
        if event == "start":
            self.started += 1
            self.in_flight = unit
        else:
            self.in_flight = None
        return unit_line(unit, result, self.started, len(self.units), virtual=self.virtual)

    def interrupted_lines(self, signal_name: str, complete: set[str], resume: str) -> list[str]:
        """`complete`: the keys of the units with a marker in the run directory now (one whose marker was just
        written is complete, though its "done" line is not out yet)."""
        total = len(self.units)
        first = f"specdrill: stopped by {signal_name}: {len(complete)} of {total} units complete"
        if self.in_flight is not None and self.in_flight.key not in complete:
            u = self.in_flight
            first += (
                f"; unit arm={u.arm} shape={u.shape} repeat={u.repeat} was in flight and is not complete "
                "(resuming runs it again from its start)"
            )
        if len(complete) == total:
            return [first, f"every unit is complete; the report: specdrill report {shlex.quote(self.output)}"]
        return [first, f"resume with: {resume}"]
