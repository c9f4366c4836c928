"""The walk: how a campaign file travels through `specdrill simulate`, counted on one in-process run.

    python -m tools.walk CAMPAIGN.yaml [--output DIR] [--console FILE] [--pin] [--json]

runs `specdrill simulate CAMPAIGN.yaml --output DIR` in this process under `sys.setprofile` (every thread) and
prints what it counted. The definitions:

- **stage**: orchestrator's folders in the order a campaign flows through them, earliest first:
  0 cli (orchestrator/cli/, orchestrator/entry.py: the command that drives the rest), 1 plan (the campaign),
  2 rundir (the run directory), 3 run (execute/, virtual/, search/), 4 analysis, 5 decide (decide/, calibrate/),
  6 report (report/, compare/). orchestrator's root utilities (logs, numfmt, docs tooling) and everything outside
  orchestrator have no stage: they are looked through.
- **call event**: a Python function of a staged module starts (or a generator of one resumes); its *caller* is
  the nearest frame below it in a staged module (a stage calling a library that calls back into a stage counts
  from the stage that made the call). No staged caller: not an event.
- **entry** into a module: a call event whose caller is in another module.
- **climb** (the campaign file climbs back up): a call event into plan/ (the campaign) from a caller in a later
  stage (rundir onwards): the unit loop asking the campaign for its arms again, the analysis re-deriving them.
  `climbs` counts distinct call sites (caller's file and line, callee's file and function), so that a campaign
  with more units does not climb more; `climb calls` counts every event. **stage climbs** are the same for any
  stage (the analysis reading the run directory's layout is one): the shape of the flow, reported beside.
- **arm lists built**: `Campaign.arms()` returns holding arm objects not seen before (a cached list hands back
  the same ones); `arms() calls` counts every call.
- **profile reads**: files opened (the `open` audit event) that are simulated-engine profiles: a YAML file under
  serve_apps/profiles/, or the file the campaign's `engine.profile` names. **profile parses**: calls of
  `load_yaml_model` with the `Profile` model.

`--pin` makes the run's own randomness and clock fixed (uuid4 from a seeded generator, `time.gmtime()` at a fixed
instant): two runs of one campaign then write byte-identical traces and console output, and summary.json differs
only where DuckDB's float sums differ in their last bits from one run to the next (its aggregation order is not
fixed, one thread or many) and in the seal, a digest of that content. `--save DIR` keeps the console output and
summary.json; `--same-as DIR` checks a run against them (console byte for byte, summary.json value for value with
floats equal to 12 significant digits and the seal left out) and exits 1 where they differ: the check that a
change to the code left the output alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ORCHESTRATOR = REPO / "orchestrator"
STAGES: dict[str, int] = {
    "cli": 0, "entry.py": 0, "plan": 1, "rundir": 2, "execute": 3, "virtual": 3, "search": 3,
    "analysis": 4, "decide": 5, "calibrate": 5, "report": 6, "compare": 6,
}  # fmt: skip
STAGE_NAMES = ("cli", "plan", "rundir", "run", "analysis", "decide", "report")
PLAN = STAGES["plan"]
PROFILE_DIR = REPO / "serve_apps" / "profiles"
PINNED_EPOCH_S = 1_767_225_600  # 2026-01-01 00:00:00 UTC


@dataclass(frozen=True)
class Place:
    module: str  # orchestrator/plan/campaign.py
    stage: int


def place_of(filename: str) -> Place | None:
    """The staged module a code object's file is, or None (outside orchestrator, or an unstaged root module)."""
    try:
        relative = Path(filename).resolve().relative_to(ORCHESTRATOR)
    except ValueError:
        return None
    stage = STAGES.get(relative.parts[0])
    return None if stage is None else Place(f"orchestrator/{relative.as_posix()}", stage)


@dataclass
class Walk:
    """What one run counted (see the module's docstring for each name)."""

    events: int = 0
    entries: Counter[str] = field(default_factory=Counter)  # module -> entries (call events)
    entry_sites: dict[str, set[tuple[str, int, str]]] = field(default_factory=dict)  # module -> distinct sites
    climb_sites: Counter[str] = field(default_factory=Counter)  # "caller:line -> callee:function" -> events
    stage_climb_sites: Counter[str] = field(default_factory=Counter)  # the same, into any earlier stage
    arms_calls: int = 0
    arm_lists_built: int = 0
    profile_reads: Counter[str] = field(default_factory=Counter)  # path -> opens
    parses: Counter[str] = field(default_factory=Counter)  # model name -> load_yaml_model calls

    def as_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "climbs": len(self.climb_sites),
            "climb_calls": sum(self.climb_sites.values()),
            "climb_sites": dict(sorted(self.climb_sites.items())),
            "stage_climbs": len(self.stage_climb_sites),
            "stage_climb_calls": sum(self.stage_climb_sites.values()),
            "entries": dict(sorted(self.entries.items())),
            "entry_sites": {m: len(s) for m, s in sorted(self.entry_sites.items())},
            "arms_calls": self.arms_calls,
            "arm_lists_built": self.arm_lists_built,
            "profile_reads": sum(self.profile_reads.values()),
            "profile_read_paths": dict(sorted(self.profile_reads.items())),
            "profile_parses": self.parses.get("Profile", 0),
            "yaml_parses": dict(sorted(self.parses.items())),
        }


class Walker:
    """The profile function and the audit hook that fill a Walk while `active`."""

    def __init__(self, profile_paths: set[Path]) -> None:
        self.walk = Walk()
        self.active = False
        self._places: dict[str, Place | None] = {}
        self._profile_paths = profile_paths
        self._arms_seen: list[Any] = []  # kept alive, so that an id is never reused for another arm
        self._arm_ids: set[int] = set()

    def _place(self, filename: str) -> Place | None:
        if filename not in self._places:
            self._places[filename] = place_of(filename)
        return self._places[filename]

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self._call(frame)
        elif event == "return" and frame.f_code.co_qualname == "Campaign.arms":
            self._arms_returned(arg)

    def _call(self, frame: FrameType) -> None:
        code = frame.f_code
        if code.co_qualname == "load_yaml_model" and code.co_filename.endswith("config_io.py"):
            model = frame.f_locals.get("model")
            self.walk.parses[getattr(model, "__name__", str(model))] += 1
            return
        callee = self._place(code.co_filename)
        if callee is None:
            return
        if code.co_qualname == "Campaign.arms":
            self.walk.arms_calls += 1
        below = frame.f_back
        while below is not None and self._place(below.f_code.co_filename) is None:
            below = below.f_back
        if below is None:
            return
        caller = self._place(below.f_code.co_filename)
        assert caller is not None
        self.walk.events += 1
        site = (caller.module, below.f_lineno, code.co_qualname)
        if caller.module != callee.module:
            self.walk.entries[callee.module] += 1
            self.walk.entry_sites.setdefault(callee.module, set()).add(site)
        if caller.stage > callee.stage:
            name = f"{caller.module}:{below.f_lineno} -> {callee.module}:{code.co_qualname}"
            self.walk.stage_climb_sites[name] += 1
            if callee.stage == PLAN:
                self.walk.climb_sites[name] += 1

    def _arms_returned(self, arms: Any) -> None:
        if not isinstance(arms, list | tuple) or not arms:
            return
        if any(id(arm) not in self._arm_ids for arm in arms):
            self.walk.arm_lists_built += 1
            self._arms_seen.extend(arms)
            self._arm_ids.update(id(arm) for arm in arms)

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or event != "open" or not isinstance(args[0], str | Path):
            return
        path = Path(args[0])
        if path.suffix not in {".yaml", ".yml"}:
            return
        resolved = path.resolve()
        if resolved.parent == PROFILE_DIR or resolved in self._profile_paths:
            self.walk.profile_reads[str(resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved)] += 1


def campaign_profile_paths(campaign_file: Path) -> set[Path]:
    """The profile file a campaign's `engine.profile` names, where it names a file (read without the product's
    loader, so that reading it here is not counted)."""
    import yaml

    data = yaml.safe_load(campaign_file.read_text())
    profile = (data.get("engine") or {}).get("profile") if isinstance(data, dict) else None
    if not isinstance(profile, str) or not profile.endswith((".yaml", ".yml")):
        return set()
    return {(campaign_file.parent / profile).resolve(), Path(profile).resolve()}


@contextlib.contextmanager
def pinned(seed: int = 0) -> Iterator[None]:
    """uuid4 from a seeded generator, `time.gmtime()` (no argument) at PINNED_EPOCH_S: a run's ids and stamps
    fixed, so the output of two runs can be compared byte for byte."""
    rng = random.Random(seed)
    real_uuid4, real_gmtime = uuid.uuid4, time.gmtime

    def uuid4() -> uuid.UUID:
        return uuid.UUID(int=rng.getrandbits(128), version=4)

    def gmtime(seconds: float | None = None) -> time.struct_time:
        return real_gmtime(PINNED_EPOCH_S if seconds is None else seconds)

    uuid.uuid4, time.gmtime = uuid4, gmtime  # type: ignore[assignment]
    try:
        yield
    finally:
        uuid.uuid4, time.gmtime = real_uuid4, real_gmtime


def walk_simulate(
    campaign_file: str, output: str, *, console: str | None = None, pin: bool = False
) -> tuple[Walk, int]:
    """`specdrill simulate CAMPAIGN --output OUTPUT` in this process, walked; returns the walk and the exit code."""
    from orchestrator.cli import main

    walker = Walker(campaign_profile_paths(Path(campaign_file)))
    sys.addaudithook(walker.audit)  # cannot be removed: `active` turns it off
    code = 0
    with contextlib.ExitStack() as stack:
        if pin:
            stack.enter_context(pinned())
        sink = stack.enter_context(open(console or "/dev/null", "w"))
        stack.enter_context(contextlib.redirect_stdout(sink))
        stack.enter_context(contextlib.redirect_stderr(sink))
        walker.active = True
        threading.setprofile(walker.profile)
        sys.setprofile(walker.profile)
        try:
            main(["simulate", campaign_file, "--output", output])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            walker.active = False
    return walker.walk, code


SEAL = "seal"
FLOAT_DIGITS = 12


def json_differences(a: Any, b: Any, where: str = "$") -> list[str]:
    """Where two summary.json values differ: floats to FLOAT_DIGITS significant digits, the seal left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a.keys() ^ b.keys())} in one only"]
        return [d for k in a if k != SEAL for d in json_differences(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items, then {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in json_differences(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        same = f"{a:.{FLOAT_DIGITS}g}" == f"{b:.{FLOAT_DIGITS}g}"
        return [] if same else [f"{where}: {a!r}, then {b!r}"]
    return [] if type(a) is type(b) and a == b else [f"{where}: {a!r}, then {b!r}"]


def output_differences(saved: Path, console: Path, run: Path) -> list[str]:
    """How a run's console output and summary.json differ from those saved by `--save`."""
    problems = []
    if (saved / "console.txt").read_bytes() != console.read_bytes():
        problems.append("console output differs")
    before = json.loads((saved / "summary.json").read_text())
    after = json.loads((run / "summary.json").read_text())
    problems += [f"summary.json {d}" for d in json_differences(before, after)]
    return problems


def render(walk: Walk, top: int) -> str:
    d = walk.as_dict()
    lines = [
        f"call events {d['events']}; climbs back into the campaign {d['climbs']} call sites ({d['climb_calls']} "
        f"calls); stage climbs {d['stage_climbs']} call sites ({d['stage_climb_calls']} calls)",
        f"Campaign.arms(): {d['arms_calls']} calls, {d['arm_lists_built']} arm lists built",
        f"profile YAML: {d['profile_reads']} reads {d['profile_read_paths']}, {d['profile_parses']} parses",
        "entries (call sites / calls), most entered first:",
    ]
    by_calls = sorted(walk.entries.items(), key=lambda kv: (-len(walk.entry_sites[kv[0]]), -kv[1], kv[0]))
    lines += [f"  {module}: {len(walk.entry_sites[module])} / {calls}" for module, calls in by_calls[:top]]
    lines.append("climbs back into the campaign, by call site (calls):")
    lines += [f"  {site} ({calls})" for site, calls in sorted(walk.climb_sites.items())]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.walk", description=__doc__.split("\n\n")[0])
    parser.add_argument("campaign")
    parser.add_argument("--output", default="runs/walk", help="the run directory (replaced if it exists)")
    parser.add_argument("--console", default=None, help="keep the command's output in this file")
    parser.add_argument("--pin", action="store_true", help="fixed uuid4 and clock: byte-identical reruns")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--top", type=int, default=12, help="modules listed by entries")
    parser.add_argument("--save", type=Path, default=None, help="keep the console output and summary.json here")
    parser.add_argument("--same-as", type=Path, default=None, help="check them against those --save kept")
    args = parser.parse_args(argv)
    import shutil
    import tempfile

    shutil.rmtree(args.output, ignore_errors=True)
    console = Path(args.console or tempfile.mkstemp(prefix="walk-console-")[1])
    walk, code = walk_simulate(args.campaign, args.output, console=str(console), pin=args.pin)
    print(json.dumps(walk.as_dict(), indent=2) if args.json else render(walk, args.top))
    if code:
        print(f"walk: specdrill simulate exited {code}", file=sys.stderr)
        return code
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(console, args.save / "console.txt")
        shutil.copyfile(Path(args.output) / "summary.json", args.save / "summary.json")
    if args.same_as is not None:
        problems = output_differences(args.same_as, console, Path(args.output))
        for problem in problems[:20]:
            print(f"walk: not the same as {args.same_as}: {problem}", file=sys.stderr)
        if problems:
            return 1
        print(f"walk: console output and summary.json the same as {args.same_as}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
