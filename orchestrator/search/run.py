"""`specdrill search`'s runner glue: each step of the crossover search (orchestrator/search/bracket.py) as one
paired unit per arm, written into a normal run directory, and measured by the report's own analysis.

A step is a `sustained` shape at the step's rate, lasting `unit_requests / rate` seconds, added to the run's
campaign (the original, its arms cut to the searched arm and its `off`, its shapes the search's, in the order
run). The two arms get the same requests (the shape, seed and repeat fix them). The manifest is rewritten with
the grown campaign after every unit, so the directory is always one `specdrill report` reads; search.json beside
it holds the path (rate, ratio, interval, decision per step) and the outcome.

Virtual time (a simulated engine) plays the units in their own slots, as `specdrill simulate` does; real time
deploys both arms on Ray once and runs the units through the load workers, as `specdrill run` does (vLLM arms
too: the same deploy and the same runner).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from scipy.special import ndtri

from orchestrator.analysis.gates import engine_lagged
from orchestrator.analysis.opmap.bands import rate_bands
from orchestrator.analysis.opmap.operating_map import operating_map
from orchestrator.analysis.opmap.results import MapSettings, Speedup
from orchestrator.analysis.read.db import EngineSettings
from orchestrator.analysis.read.inputs import load_run
from orchestrator.analysis.read.views import run_requests
from orchestrator.execute.runner import Executor, Group, Work, run_units
from orchestrator.logs import get_logger
from orchestrator.plan.campaign import Campaign, CampaignError
from orchestrator.rundir.layout import MANIFEST, RunStore, Unit
from orchestrator.rundir.manifest import fingerprint, open_run
from orchestrator.search.bracket import Outcome, SearchConfig, Step, next_step, path_line, spent
from orchestrator.search.executed import executed_line, executed_policy, predicted_drop, qualified
from orchestrator.search.pair import Pair, pick_pair, search_campaign
from orchestrator.search.point import VERDICTS, SearchPoint, Side, across_samples, rate_text
from orchestrator.search.record import SEARCH_FILE, Mode, SearchRecord, StepRecord
from orchestrator.virtual.executor import VIRTUAL_EPOCH_NS, VirtualExecutor
from serve_apps.engine_kinds.registry import kind_of

log = get_logger(__name__)


def default_rates(campaign: Campaign) -> tuple[float, float]:
    """The lowest and highest positive rate the campaign's open-loop shapes offer: where its own traffic goes (one
    rate only: half and twice it)."""
    rates = [r for shape in campaign.shapes.values() if shape.open_loop for p in shape.phases()
             for r in (p.rate_start, p.rate_end) if r > 0]  # fmt: skip
    if not rates:
        raise CampaignError(
            "shapes: no open-loop shape offers a request rate to start the search from; give --low and --high"
        )
    if len(set(rates)) == 1:
        return rates[0] / 2, rates[0] * 2
    return min(rates), max(rates)


def shape_name(n: int, rate: float) -> str:
    return f"s{n:02d}-{rate:.4g}rps".replace(".", "_")


def shape_of(rate: float, unit_requests: int) -> dict[str, Any]:
    return {"kind": "sustained", "rate": rate, "duration_s": unit_requests / rate}


def measure(run_dir: str, arm: str, shapes: list[str], seed: int) -> Speedup | None:
    """The arm against its `off` over the units of these shapes (one rate), pair by pair, with the report's own
    machinery (one offered-rate band holding every request): its deciding ratio, interval and verdict."""
    inputs = load_run(run_dir)
    units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units if u.unit.shape in shapes]
    requests = run_requests(inputs.store.root, units, settings=EngineSettings.from_env())
    try:
        rate_map = operating_map(requests, inputs.arms, inputs.campaign.slo, rate_bands([0.0, math.inf]),
                                 settings=MapSettings(seed=seed))  # fmt: skip
    finally:
        requests.close()
    cells = [c for c in rate_map.cells if c.arm == arm and c.speedup is not None]
    return cells[0].speedup if cells else None


def side_of(speedup: Speedup | None) -> Side:
    ratio = None if speedup is None else speedup.deciding
    if ratio is not None and ratio.low is not None and ratio.low > 1:
        return "above"
    if ratio is not None and ratio.high is not None and ratio.high < 1:
        return "below"
    return "unsure"


def sample_of(speedup: Speedup | None, measure_name: str, confidence: float) -> tuple[float, float | None] | None:
    """One unit's own ratio on the measure that decides at its rate (its traffic sample), and the standard
    error of its log from the unit's own bootstrap interval (None without one)."""
    if speedup is None:
        return None
    ratio = speedup.goodput if measure_name == "goodput" else speedup.tpot
    if ratio.point is None or ratio.point <= 0:
        return None
    if ratio.low is None or ratio.high is None or ratio.low <= 0:
        return ratio.point, None
    z = float(ndtri(0.5 + confidence / 2))
    return ratio.point, math.log(ratio.high / ratio.low) / (2 * z)


def point_of(rate: float, pooled: Speedup | None, alone: list[Speedup | None], requests: int,
             confidence: float) -> SearchPoint:  # fmt: skip
    """A rate's point from its counted units: the measure the pooled analysis decided by, each unit's own ratio
    on it (a traffic sample), and the interval across them (search_point.across_samples); its verdict the
    search's own (VERDICTS: by that interval against 1, no margin)."""
    measure_name = "goodput" if pooled is not None and pooled.decided_by == "goodput" else "per-token latency"
    found = [s for s in (sample_of(a, measure_name, confidence) for a in alone) if s is not None]
    samples = tuple(r for r, _ in found)
    errors = tuple(e for _, e in found if e is not None)
    sides = tuple(side_of(a) for a in alone)
    ratio, low, high = across_samples(samples, confidence, errors) if samples else (None, None, None)
    point = SearchPoint(rate=rate, ratio=ratio, low=low, high=high, measure=measure_name, verdict="",
                        units=len(alone), requests=requests, unit_sides=sides, samples=samples,
                        sample_errors=errors)  # fmt: skip
    return point.model_copy(update={"verdict": VERDICTS[point.standing]})


def left_after(config: SearchConfig, discarded: int) -> SearchConfig:
    """The configuration the pure search sees: the requests of units that were not counted spent from its budget."""
    return config.model_copy(update={"not_counted_requests": discarded}) if discarded else config


def discarded_line(n: int, alone: SearchPoint, step: Step, why: str) -> str:
    return (f"{n:>2}. {rate_text(alone.rate):>6} req/s  not counted: {why} (this unit alone: ratio "
            f"{alone.ratio_text} on {alone.measure}; requests {alone.requests}) <- {step.why}")  # fmt: skip


def lagged_outcome(rates: list[float], bound: float) -> Outcome:
    at = ", ".join(rate_text(r) for r in sorted(set(rates)))
    return Outcome(
        kind="host_lagged", lo=None, hi=None, estimate=None,
        message=f"no answer: the host could not keep pace with the simulated engine in {len(rates)} units (at "
        f"{at} req/s; engine lag beyond load.engine_lag_bound {bound:.0%} of the model's step time), so their "
        "latencies are the host's; slow the engine (engine.time_scale), lower the rates, or run on a quieter host",
    )  # fmt: skip


@dataclass
class SearchRun:
    store: RunStore
    record: SearchRecord


def run_search(
    campaign: Campaign,
    *,
    arm: str,
    against: str,
    output: str,
    config: SearchConfig,
    mode: Mode,
    address: str | None = None,
    echo: Callable[[str], None] = lambda _line: None,
) -> SearchRun:
    """The search to its outcome; every unit kept in `output`, a fresh run directory."""
    pair = pick_pair(campaign, arm, against)
    if mode == "virtual" and not kind_of(campaign.engine).runs_in_virtual_time:
        raise CampaignError(f"engine: kind {campaign.engine.kind!r} cannot run in virtual time; use --real-time")
    existing = RunStore.existing(output)
    if existing is not None and existing.exists(MANIFEST):
        raise CampaignError(f"output: {output} already holds a run; the search writes a fresh run directory")
    grown = search_campaign(campaign, pair, output, {})
    by_name = {a.name: a for a in grown.arms()}
    chosen, base = by_name[pair.arm_name], by_name[pair.base_name]
    store = RunStore(output)
    manifest = open_run(grown, store, mode=mode)
    record = SearchRecord(arm=chosen.name, against=base.name, mode=mode, config=config, steps=[], points=[],
                          outcome=None, requests=0, lines=[])  # fmt: skip
    added = (f" ({base.name} added: the campaign has no `off` arm on {chosen.topology.label}, the search compares "
             "on equal hardware)" if pair.added else "")  # fmt: skip
    head = (f"search: {chosen.name} against {base.name}{added} ({mode} time), rates {config.low:g}-{config.high:g} "
            f"req/s (limits {config.min_rate:g}-{config.max_rate:g}), {config.unit_requests} requests per arm per "
            f"unit, bracket to {config.tolerance:.0%}"
            + (f", budget {config.budget_requests} requests" if config.budget_requests else ""))  # fmt: skip
    record.lines.append(head)
    echo(head)
    warning = predicted_drop(chosen)
    if warning is not None:
        record.lines.append(warning)
        echo(warning)
    executor: Executor
    if mode == "virtual":
        manifest["virtual_epoch_ns"] = VIRTUAL_EPOCH_NS
        executor = VirtualExecutor()  # each unit in the slot after the last: the next one is not known ahead
    else:
        # Both arms deployed at once (a step needs both), the units one arm after the other as `specdrill run`
        # runs them; an endpoint campaign's servers are used as they are.
        from orchestrator.execute.ray_executor import RayExecutor

        executor = RayExecutor(grown, address=address, arms=[base.name, chosen.name])
    began = time.perf_counter()
    group = Group(grown, [base, chosen], [])
    group.units = SearchSteps(campaign, pair, output, config, record, store, manifest, group, echo).units()
    run_units([group], executor, store=store, manifest=manifest)
    assert record.outcome is not None
    record.executed = executed_policy(output, chosen.name)
    ran = None if record.executed is None else executed_line(chosen.name, base.name, record.executed)
    if ran is not None:
        record.lines.append(ran)
        echo(ran)
    record.outcome = qualified(record.outcome, record.executed)
    tail = f"{record.outcome.message} ({len(record.steps)} units per arm, {record.requests} requests, " \
           f"{time.perf_counter() - began:.1f} s)"  # fmt: skip
    record.lines.append(tail)
    echo(tail)
    store.write_json(SEARCH_FILE, record.model_dump(mode="json"))
    log.info("search.done", outcome=record.outcome.kind, units=len(record.steps), requests=record.requests)
    return SearchRun(store=store, record=record)


@dataclass
class SearchSteps:
    """The search as a source of units (orchestrator.execute.runner): a step's unit for each arm, then, once both ran,
    the step measured and recorded and the next one decided from every point so far, until an outcome."""

    campaign: Campaign
    pair: Pair
    output: str
    config: SearchConfig
    record: SearchRecord
    store: RunStore
    manifest: dict[str, Any]
    group: Group  # its results: each unit's, appended by the runner before the next unit is asked for
    echo: Callable[[str], None]

    def units(self) -> Iterator[Work]:
        config, record, campaign, pair, output = self.config, self.record, self.campaign, self.pair, self.output
        chosen, base = self.group.arms[1], self.group.arms[0]
        shapes: dict[str, dict[str, Any]] = {}
        by_rate: dict[float, list[str]] = {}  # the shapes measured at each rate
        alone_by_rate: dict[float, list[Speedup | None]] = {}  # each of their units measured alone: its sample
        points: list[SearchPoint] = []
        while True:
            not_counted = [s for s in record.steps if s.discarded]  # their engine lagged
            discarded = sum(s.point.requests for s in not_counted)
            if len(not_counted) > config.max_lagged_units:
                bound = self.group.campaign.load.engine_lag_bound
                record.outcome = lagged_outcome([s.step.rate for s in not_counted], bound)
                return
            decided = next_step(points, left_after(config, discarded), arm=chosen.name, against=base.name)
            if isinstance(decided, Outcome):
                record.outcome = decided
                return
            step: Step = decided
            rate = round(step.rate, 6)
            name = shape_name(len(shapes) + 1, rate)
            shapes[name] = shape_of(rate, config.unit_requests)
            grown = search_campaign(campaign, pair, output, shapes)
            self.group.campaign = grown
            self.manifest["campaign"] = grown.model_dump(mode="json", by_alias=True)
            self.manifest["fingerprint"] = fingerprint(grown)
            arms = grown.arms()
            for arm in arms:
                yield Work(grown, arm, Unit(arm=arm.name, shape=name, repeat=0))
            results = self.group.results[-len(arms) :]
            sent = sum(r.scheduled for r in results)
            lagged = engine_lagged(results)
            why: str | None = None
            if lagged:  # the host's latencies, not the arms': kept in the run directory, not counted
                why = f"engine lagged in {'; '.join(lagged)}"
                unit = measure(output, chosen.name, [name], campaign.seed)
                shown = point_of(rate, unit, [unit], sent, config.confidence)
                discarded += sent
                line = discarded_line(len(record.steps) + 1, shown, step, why)
            else:
                by_rate.setdefault(rate, []).append(name)
                previous = next((p for p in points if p.rate == rate), None)
                pooled = measure(output, chosen.name, by_rate[rate], campaign.seed)
                # Each unit alone too: its own ratio is one traffic sample, the interval is taken across them.
                alone = pooled if previous is None else measure(output, chosen.name, [name], campaign.seed)
                alone_by_rate.setdefault(rate, []).append(alone)
                shown = point_of(rate, pooled, alone_by_rate[rate], sent + (previous.requests if previous else 0),
                                 config.confidence)  # fmt: skip
                points = [shown if p.rate == rate else p for p in points] if previous else [*points, shown]
                line = path_line(len(record.steps) + 1, shown, step)
            record.steps.append(StepRecord(step=step, shape=name, point=shown, discarded=why))
            record.points, record.requests = points, spent(points) + discarded
            record.lines.append(line)
            self.echo(line)
            self.store.write_json(SEARCH_FILE, record.model_dump(mode="json"))


def grid_points(
    campaign: Campaign,
    *,
    arm: str,
    against: str,
    output: str,
    rates: list[float],
    unit_requests: int,
    units_per_rate: int,
    mode: Mode,
    address: str | None = None,
    confidence: float = 0.95,
) -> list[SearchPoint]:
    """The fixed grid the search is held to: every rate measured with `units_per_rate` units of the search's
    length, as one ordinary campaign run (`specdrill simulate` or `specdrill run`), each rate measured as the
    search measures its steps."""
    pair = pick_pair(campaign, arm, against)
    shapes = {shape_name(i * units_per_rate + u + 1, rate): shape_of(rate, unit_requests)
              for i, rate in enumerate(rates) for u in range(units_per_rate)}  # fmt: skip
    grid = search_campaign(campaign, pair, output, shapes)
    if mode == "virtual":
        from orchestrator.virtual.campaign import simulate_campaign

        simulate_campaign(grid)
    else:
        from orchestrator.execute.ray_executor import run_campaign

        run_campaign(grid, address=address)
    inputs = load_run(output)
    # The search's rule for real time: a unit whose engine lagged measured the host; its rate is measured on
    # the units where neither arm lagged (none left: no ratio at that rate).
    lagged = {u.unit.shape for u in inputs.units if u.engine_lagged}
    points = []
    for i, rate in enumerate(rates):
        names = list(shapes)[i * units_per_rate : (i + 1) * units_per_rate]
        sent = sum(u.scheduled for u in inputs.units if u.unit.shape in names)
        kept = [n for n in names if n not in lagged]
        speedup = measure(output, pair.arm_name, kept, campaign.seed) if kept else None
        alone = [measure(output, pair.arm_name, [n], campaign.seed) for n in kept] if len(kept) > 1 else [speedup]
        points.append(point_of(rate, speedup, alone if kept else [], sent, confidence))
    return points
