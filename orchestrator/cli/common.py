"""What the commands share: one-line usage errors, the options several commands take, and parsing of the values
(profile, policy, topology, workload, campaign file) that turns bad input into one line and exit 2."""

from __future__ import annotations

import os
from typing import Any

import click
from pyarrow.fs import LocalFileSystem
from rich.console import Console

from loadshapes import limits as run_limits
from loadshapes.badfile import make_directory
from loadshapes.mixes import BUILTIN_WORKLOADS, builtin_workload
from orchestrator.plan.campaign import Campaign, CampaignError, load_campaign
from orchestrator.rundir.lock import force_foreign_locks
from serve_apps.policies import PolicyError, Topology, parse_policy, parse_topology
from serve_apps.sim.profile import Profile, ProfileError, load_profile

EXIT_USAGE = 2


def fail(message: str) -> None:
    raise click.UsageError(message)


def _set_limits(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> None:
    try:
        run_limits.set_limits(run_limits.parse_limits(value))
    except run_limits.LimitSyntaxError as exc:
        raise click.BadParameter(str(exc)) from None


# The plan-size limits of the command (docs/reference/campaign-reference.md, "Limits"): set before the campaign is read,
# since reading a replay file already counts against two of them.
limit_option = click.option(
    "--limit", "limits", multiple=True, metavar="NAME=VALUE", callback=_set_limits, expose_value=False,
    is_eager=True, help="raise (or lower) a plan-size limit, e.g. --limit requests=2e7 --limit memory_gib=16",
)  # fmt: skip


# The run directory's writer lock (orchestrator/rundir/lock.py): one held on another host is refused unless forced.
force_lock_option = click.option(
    "--force-lock", is_flag=True, expose_value=False, callback=lambda _c, _p, force: force_foreign_locks(force),
    help="take over the run directory's writer lock when another host holds it (check that run is gone first)",
)  # fmt: skip


def int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{what}: {text!r} is not a comma-separated list of integers")
    if not values or any(v < 1 for v in values):
        fail(f"{what}: every value must be an integer >= 1, got {text!r}")
    return values


def float_list(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{what}: {text!r} is not a comma-separated list of numbers")
    if not values or any(not v > 0 for v in values):
        fail(f"{what}: every value must be > 0, got {text!r}")
    return values


def profile_named(name: str) -> Profile:
    try:
        return load_profile(name)
    except ProfileError as exc:
        fail(str(exc))
        raise


def policy_of(text: str, profile: Profile) -> Any:
    try:
        return parse_policy(text, default_method=profile.drafter_method, default_model=profile.drafter_model)
    except PolicyError as exc:
        fail(str(exc))


def topology_of(text: str) -> Topology:
    try:
        return parse_topology(text)
    except ValueError:
        fail(f"--topology {text!r}: expected single, replicas:N or data_parallel:N")
        raise


def workload_named(name: str, profile: Profile) -> Any:
    if name not in BUILTIN_WORKLOADS:
        fail(f"--workload {name!r}: unknown; built in: {', '.join(BUILTIN_WORKLOADS)}")
    workload = builtin_workload(name)
    if profile.resolve_category(workload.category) is None:
        fail(f"--workload {name!r}: profile {profile.name!r} has no acceptance for category {workload.category!r}")
    return workload


def campaign_of(path: str) -> Campaign:
    try:
        campaign = load_campaign(path)
    except CampaignError as exc:
        fail(str(exc))
        raise
    for line in campaign.warnings():
        click.echo(f"specdrill: warning: {line}", err=True)
    return campaign


def console() -> Console:
    out = Console()
    return out if out.is_terminal else Console(width=160)


def output_directory(path: str, what: str) -> None:
    """The directory a command writes into exists or is created, or one line says why not (a regular file in the
    way, /proc), before the command spends any time."""
    make_directory(LocalFileSystem(), os.path.abspath(path), what)
