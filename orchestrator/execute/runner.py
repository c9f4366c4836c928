"""The one unit loop of every runner: `run_units(source, executor)`.

A source yields groups: the arms that are up together and the units run on them, lazily where the next unit
depends on the results so far (a search's next step). An executor brings a group's arms up (deploy and warm on
Ray, build the twins in virtual time) and runs one unit, writing its rows and timeline. What every runner does
the same lives here once: resume (a complete unit is skipped, a partial one's files removed), the warnings on a
unit's result, interrupts (a signal during a unit leaves it incomplete), the marker and the manifest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.execute.interrupts import raise_pending
from orchestrator.logs import get_logger
from orchestrator.plan.campaign import Campaign
from orchestrator.rundir.layout import MANIFEST, RunStore, Unit, UnitResult
from orchestrator.rundir.manifest import finish_run, record_unit, units_of
from serve_apps.arms import ArmSpec

log = get_logger(__name__)

OnUnit = Callable[[Unit, str, UnitResult | None], None]


@dataclass(frozen=True)
class Work:
    """One unit to run, with the campaign it belongs to (a search grows its campaign step by step)."""

    campaign: Campaign
    arm: ArmSpec
    unit: Unit


@dataclass
class Group:
    """Arms up together and the units run on them. `units` may be a generator reading `results` (each unit's
    result is appended before the next unit is asked for): that is how an adaptive source sees what it ran."""

    campaign: Campaign
    arms: list[ArmSpec]
    units: Iterable[Work]
    results: list[UnitResult] = field(default_factory=list)


class Executor(Protocol):
    def session(self) -> AbstractContextManager[None]:
        """What lasts the whole run (the load worker actors)."""
        ...

    def arms_up(
        self, campaign: Campaign, arms: Sequence[ArmSpec], manifest: dict[str, Any]
    ) -> AbstractContextManager[None]:
        """The arms ready to measure, each one's manifest entry written into `manifest`; down again on exit."""
        ...

    def run_unit(self, work: Work, *, run: str, store: RunStore) -> UnitResult:
        """The unit's rows and timeline written (its partial files are gone already); the marker is the loop's."""
        ...


def run_units(
    source: Iterable[Group], executor: Executor, *, store: RunStore, manifest: dict[str, Any],
    on_unit: OnUnit | None = None,
) -> None:  # fmt: skip
    """Every pending unit of every group, then the run finished (its manifest sealed, its writer lock released).
    `on_unit(unit, "start", None)` before a unit, `on_unit(unit, "done", result)` after it."""
    with executor.session():
        for group in source:
            with executor.arms_up(group.campaign, group.arms, manifest):
                store.write_json(MANIFEST, manifest)
                for work in group.units:
                    if store.is_complete(work.unit):
                        continue
                    result = _run_one(work, executor, store=store, manifest=manifest, on_unit=on_unit)
                    group.results.append(result)
    finish_run(store, manifest)


def _run_one(
    work: Work, executor: Executor, *, store: RunStore, manifest: dict[str, Any], on_unit: OnUnit | None
) -> UnitResult:
    unit = work.unit
    if on_unit:
        on_unit(unit, "start", None)
    log.info("unit.start", unit=unit.key)
    removed = store.remove_partial(unit)
    if removed:
        log.info("unit.partial_removed", unit=unit.key, files=removed)
    result = executor.run_unit(work, run=manifest["run"], store=store)
    warn_unit(result)
    raise_pending()  # a signal that came during the unit leaves it incomplete, even one Python swallowed
    record_unit(store, manifest, result)  # the unit's marker, then its manifest entry
    if on_unit:
        on_unit(unit, "done", result)
    return result


def warn_unit(result: UnitResult) -> None:
    key = result.unit.key
    if result.incomplete:
        log.error("unit.incomplete", unit=key, missing=result.missing, note="a load worker was lost")
    elif result.rows != result.scheduled:
        log.warning("unit.rows_mismatch", unit=key, rows=result.rows, scheduled=result.scheduled)
    if result.saturated:
        capped = sum(s.waited_at_connection_cap for s in result.workers)
        log.warning("unit.generator_saturated", unit=key, lateness_p99_s=result.lateness_p99_s, at_cap=capped)
    if result.engine_lagged:
        log.warning("unit.engine_lagged", unit=key, engine_lag_share=result.engine_lag_share,
                    engine_lag_p99_s=result.engine_lag_p99_s, bound=result.engine_lag_bound)  # fmt: skip


# --- the campaign's own units -----------------------------------------------------------------------------------
def pending_arms(campaign: Campaign, store: RunStore, arms: Sequence[str] | None = None) -> list[ArmSpec]:
    """The campaign's arms (those named, if any) with a unit left to run; the others are said to be complete."""
    pending = []
    for arm in campaign.arms():
        if arms is not None and arm.name not in arms:
            continue
        if all(store.is_complete(u) for u in units_of(campaign, arm)):
            log.info("arm.complete", arm=arm.name)
            continue
        pending.append(arm)
    return pending


def arm_by_arm(campaign: Campaign, store: RunStore, arms: Sequence[str] | None = None) -> Iterator[Group]:
    """One arm up at a time, all its units (a real run: one arm's engines on the hardware at a time)."""
    for arm in pending_arms(campaign, store, arms):
        yield Group(campaign, [arm], [Work(campaign, arm, u) for u in units_of(campaign, arm)])


def shape_by_shape(campaign: Campaign, store: RunStore) -> Iterator[Group]:
    """Every arm up at once, the units shape by shape and repeat by repeat, every arm in turn (virtual time:
    each (shape, repeat)'s requests are built once and played to every arm)."""
    arms = pending_arms(campaign, store)
    units = (
        Work(campaign, arm, Unit(arm=arm.name, shape=shape, repeat=repeat))
        for shape in campaign.shapes
        for repeat in range(campaign.repeats)
        for arm in arms
    )
    yield Group(campaign, arms, units)
