"""The `specdrill` command line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import click
from pyarrow.fs import LocalFileSystem
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from loadshapes import limits as run_limits
from loadshapes.badfile import BadFileError, make_directory, write_failed
from loadshapes.mixes import BUILTIN_WORKLOADS, builtin_workload
from loadshapes.slo import SloConfig
from orchestrator.campaign import Campaign, CampaignError, load_campaign
from orchestrator.logs import configure_logging
from orchestrator.progress import CampaignProgress, resume_command
from orchestrator.run_lock import force_foreign_locks
from orchestrator.rundir import RunStore, Unit, UnitResult
from orchestrator.simulate import FixedBatchPoint, SweepPoint, fixed_batch, sweep
from serve_apps.policies import PolicyError, Topology, parse_policy, parse_topology, split_policy_list
from serve_apps.sim.profile import Profile, ProfileError, load_profile

EXIT_USAGE = 2


def _fail(message: str) -> None:
    raise click.UsageError(message)


def _set_limits(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> None:
    try:
        run_limits.set_limits(run_limits.parse_limits(value))
    except run_limits.LimitSyntaxError as exc:
        raise click.BadParameter(str(exc)) from None


# The plan-size limits of the command (docs/campaign-reference.md, "Limits"): set before the campaign is read,
# since reading a replay file already counts against two of them.
_limit_option = click.option(
    "--limit", "limits", multiple=True, metavar="NAME=VALUE", callback=_set_limits, expose_value=False,
    is_eager=True, help="raise (or lower) a plan-size limit, e.g. --limit requests=2e7 --limit memory_gib=16",
)  # fmt: skip


# The run directory's writer lock (orchestrator/run_lock.py): one held on another host is refused unless forced.
_force_lock_option = click.option(
    "--force-lock", is_flag=True, expose_value=False, callback=lambda _c, _p, force: force_foreign_locks(force),
    help="take over the run directory's writer lock when another host holds it (check that run is gone first)",
)  # fmt: skip


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{what}: {text!r} is not a comma-separated list of integers")
    if not values or any(v < 1 for v in values):
        _fail(f"{what}: every value must be an integer >= 1, got {text!r}")
    return values


def _float_list(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{what}: {text!r} is not a comma-separated list of numbers")
    if not values or any(not v > 0 for v in values):
        _fail(f"{what}: every value must be > 0, got {text!r}")
    return values


def _profile(name: str) -> Profile:
    try:
        return load_profile(name)
    except ProfileError as exc:
        _fail(str(exc))
        raise


def _policy(text: str, profile: Profile) -> Any:
    try:
        return parse_policy(text, default_method=profile.drafter_method, default_model=profile.drafter_model)
    except PolicyError as exc:
        _fail(str(exc))


def _topology(text: str) -> Topology:
    try:
        return parse_topology(text)
    except ValueError:
        _fail(f"--topology {text!r}: expected single, replicas:N or data_parallel:N")
        raise


def _workload(name: str, profile: Profile) -> Any:
    if name not in BUILTIN_WORKLOADS:
        _fail(f"--workload {name!r}: unknown; built in: {', '.join(BUILTIN_WORKLOADS)}")
    workload = builtin_workload(name)
    if workload.category not in profile.acceptance:
        _fail(f"--workload {name!r}: profile {profile.name!r} has no acceptance for category {workload.category!r}")
    return workload


@click.group()
@click.version_option(package_name="specdrill", prog_name="specdrill")
@click.option("--log-level", default="WARNING", show_default=True, help="structlog level")
def cli(log_level: str) -> None:
    """specdrill: rehearse speculative-decoding policies under load."""
    configure_logging(log_level)


class _SimulateGroup(click.Group):
    """`specdrill simulate CAMPAIGN.yaml` runs a campaign in virtual time; the named subcommands stay. Its help
    shows both forms and the campaign form's options (the README's form is the one without a subcommand)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "campaign", self.commands["campaign"], args
        return super().resolve_command(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        campaign = self.commands["campaign"]
        formatter.write_usage(ctx.command_path, " ".join(campaign.collect_usage_pieces(ctx)))
        formatter.write_usage(ctx.command_path, " ".join(self.collect_usage_pieces(ctx)), prefix="   or: ")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        campaign = self.commands["campaign"]
        options = [p for p in campaign.get_params(ctx) if isinstance(p, click.Option) and "--help" not in p.opts]
        rows = [r for p in options if (r := p.get_help_record(ctx))]
        with formatter.section(f"Options of {ctx.command_path} CAMPAIGN_FILE"):
            formatter.write_dl(rows)
        super().format_options(ctx, formatter)


@cli.group(cls=_SimulateGroup)
def simulate() -> None:
    """Offline runs on the calibrated simulated engine (virtual time): `specdrill simulate CAMPAIGN.yaml`
    runs a whole campaign (same traces and report as `specdrill run`); fixed-batch and sweep are experiments."""


@simulate.command("campaign")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--output", default=None, help="run directory or URI (overrides the campaign's output)")
@click.option("--no-report", is_flag=True, help="traces only; `specdrill report RUN_DIR` later")
@_limit_option
@_force_lock_option
def simulate_campaign_cmd(campaign_file: str, output: str | None, no_report: bool) -> None:
    """A campaign in virtual time on the simulated engine: no Ray, no HTTP, the same run directory. One line per
    unit started and finished; rerun it to resume (complete units are skipped)."""
    from orchestrator.simulate_campaign import simulate_campaign

    campaign = _campaign(campaign_file)
    if output:
        campaign = campaign.model_copy(update={"output": output})
    resume = resume_command("simulate", campaign_file, [("--output", output), ("--no-report", no_report)])
    try:
        store, manifest = _run_units(
            campaign, resume, lambda on_unit: simulate_campaign(campaign, on_unit=on_unit), virtual=True
        )
    except CampaignError as exc:
        _fail(str(exc))
        raise
    click.echo(f"run {manifest['run']} (virtual time): traces in {store.traces}")
    if not no_report:
        from orchestrator.report import report_and_exit

        report_and_exit(store.root)


@simulate.command("fixed-batch")
@click.option("--profile", "profile_name", default="llama3.1-8b-h100-eagle", show_default=True)
@click.option("--policy", "policy_text", default="fixed:3", show_default=True)
@click.option("--batch-sizes", default="1,8,32,64,128", show_default=True)
@click.option("--workload", "workload_name", default="reasoning", show_default=True)
@click.option("--topology", "topology_text", default="single", show_default=True)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def fixed_batch_cmd(
    profile_name: str,
    policy_text: str,
    batch_sizes: str,
    workload_name: str,
    topology_text: str,
    seed: int,
    as_json: bool,
) -> None:
    """Throughput speedup over no speculation with B requests always in the engine (closed batch)."""
    profile = _profile(profile_name)
    policy = _policy(policy_text, profile)
    sizes = _int_list(batch_sizes, "--batch-sizes")
    if max(sizes) > profile.limits.max_num_seqs:
        _fail(f"--batch-sizes: {max(sizes)} exceeds the profile's max_num_seqs {profile.limits.max_num_seqs}")
    workload = _workload(workload_name, profile)
    topology = _topology(topology_text)
    points = fixed_batch(profile, policy, batch_sizes=sizes, workload=workload, seed=seed, topology=topology)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "profile": profile.name,
                    "policy": policy.label,
                    "workload": workload.name,
                    "topology": topology.label,
                    "seed": seed,
                    "points": [p.model_dump() for p in points],
                },
                indent=2,
            )
        )
    else:
        _print_fixed_batch(points, policy.label)


def _print_fixed_batch(points: Sequence[FixedBatchPoint], label: str) -> None:
    table = Table(title=f"{label}: throughput vs no speculation at fixed batch sizes")
    for col in ("batch", "policy tok/s", "off tok/s", "speedup", "accept len"):
        table.add_column(col, justify="right")
    for p in points:
        mal = f"{p.mean_acceptance_length:.2f}" if p.mean_acceptance_length else "-"
        table.add_row(
            str(p.batch_size),
            f"{p.policy_tokens_per_s:,.0f}",
            f"{p.off_tokens_per_s:,.0f}",
            f"{p.speedup:.2f}x",
            mal,
        )
    _console().print(table)


@simulate.command("oracle")
@click.option("--profile", "profile_name", default="llama3.1-8b-h100-eagle", show_default=True)
@click.option("--workload", "workload_name", default="reasoning", show_default=True)
@click.option("--max-k", default=4, show_default=True, type=click.IntRange(1, 16), help="largest k to try")
@click.option("--batch-sizes", default=None, help="comma-separated (default: 1 to the profile's max_num_seqs)")
@click.option("--tolerance", default=0.01, show_default=True, type=click.FloatRange(0, 1),
              help="k within this fraction of the best per-token latency count as tied")  # fmt: skip
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def oracle_cmd(
    profile_name: str,
    workload_name: str,
    max_k: int,
    batch_sizes: str | None,
    tolerance: float,
    seed: int,
    as_json: bool,
) -> None:
    """Ground truth: the k that minimises per-token latency at each batch size (fixed-batch runs, k = 0..max-k)."""
    from orchestrator.decide.oracle import DEFAULT_BATCH_SIZES, oracle

    profile = _profile(profile_name)
    workload = _workload(workload_name, profile)
    sizes = _int_list(batch_sizes, "--batch-sizes") if batch_sizes else list(DEFAULT_BATCH_SIZES)
    if min(sizes) > profile.limits.max_num_seqs:
        _fail(f"--batch-sizes: all exceed the profile's max_num_seqs {profile.limits.max_num_seqs}")
    result = oracle(profile, workload=workload, max_k=max_k, batch_sizes=sizes, seed=seed, tolerance=tolerance)
    if as_json:
        click.echo(json.dumps({**result.model_dump(mode="json"), "schedule": result.schedule()}, indent=2))
        return
    table = Table(title=f"{profile.name} / {workload.name}: per-token latency p50 (ms) at fixed batch sizes")
    for col in ("batch", *(f"k={k}" for k in range(max_k + 1)), "best k", f"within {tolerance:.0%}"):
        table.add_column(col, justify="right")
    for p in result.points:
        table.add_row(
            str(p.batch_size), *(f"{p.tpot_p50_s[k] * 1e3:.2f}" for k in range(max_k + 1)), str(p.best_k),
            ",".join(str(k) for k in p.near_best),
        )  # fmt: skip
    _console().print(table)
    click.echo(f"schedule (vLLM num_speculative_tokens_per_batch_size): {json.dumps(result.schedule())}")


@simulate.command("sweep")
@click.option("--profile", "profile_name", default="llama3.1-8b-h100-eagle", show_default=True)
@click.option("--policies", default="off,fixed:3,dynamic:3:1-64=3,65-128=1,129-512=0", show_default=True)
@click.option("--rates", default="5,20,40,60,80", show_default=True, help="arrival rates, requests/s")
@click.option("--duration", default=120.0, show_default=True, type=float, help="seconds of arrivals per rate")
@click.option("--workload", "workload_name", default="reasoning", show_default=True)
@click.option("--topology", "topology_text", default="single", show_default=True)
@click.option("--ttft-slo", default=2.0, show_default=True, type=float, help="goodput deadline on TTFT, s")
@click.option("--tpot-slo", default=0.05, show_default=True, type=float, help="goodput deadline per token, s")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def sweep_cmd(
    profile_name: str,
    policies: str,
    rates: str,
    duration: float,
    workload_name: str,
    topology_text: str,
    ttft_slo: float,
    tpot_slo: float,
    seed: int,
    as_json: bool,
) -> None:
    """Open-loop Poisson traffic at each rate against each policy; what users feel, per rate and policy."""
    profile = _profile(profile_name)
    parsed = [_policy(text, profile) for text in split_policy_list(policies)]
    if not parsed:
        _fail("--policies: give at least one policy")
    rate_list = _float_list(rates, "--rates")
    if not duration > 0:
        _fail(f"--duration must be > 0, got {duration}")
    if not (ttft_slo > 0 and tpot_slo > 0):
        _fail("--ttft-slo and --tpot-slo must be > 0")
    workload = _workload(workload_name, profile)
    topology = _topology(topology_text)
    slo = SloConfig(ttft_s=ttft_slo, tpot_s=tpot_slo)
    progress_console = Console(stderr=True)
    with Progress(console=progress_console, transient=True, disable=not progress_console.is_terminal) as progress:
        task = progress.add_task("simulating", total=len(rate_list) * len(parsed))
        points = sweep(
            profile, parsed, rates=rate_list, duration=duration, workload=workload, seed=seed, slo=slo,
            topology=topology, on_point=lambda _: progress.advance(task),
        )  # fmt: skip
    if as_json:
        click.echo(
            json.dumps(
                {
                    "profile": profile.name,
                    "workload": workload.name,
                    "topology": topology.label,
                    "duration_s": duration,
                    "seed": seed,
                    "slo": {"ttft": slo.ttft_s, "tpot": slo.tpot_s, "e2e": slo.e2e_s},
                    "points": [p.model_dump() for p in points],
                },
                indent=2,
            )
        )
    else:
        _print_sweep(points)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _print_sweep(points: Sequence[SweepPoint]) -> None:
    table = Table(title="Open-loop sweep: latencies in ms; goodput = completions/s meeting the SLO")
    for col in (
        "rate/s", "policy", "done/s", "goodput/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
        "queue p99", "mean k", "unfinished",
    ):  # fmt: skip
        table.add_column(col, justify="right", no_wrap=True)
    best: dict[float, float] = {}
    for p in points:
        best[p.rate] = max(best.get(p.rate, 0.0), p.summary.goodput)
    for p in points:
        s = p.summary
        mark = " *" if s.goodput >= 0.99 * best[p.rate] and s.goodput > 0 else ""
        table.add_row(
            f"{p.rate:g}", p.policy, f"{s.completion_rate:.1f}", f"{s.goodput:.1f}{mark}",
            _ms(s.ttft.p50), _ms(s.ttft.p99), _ms(s.tpot.p50), _ms(s.tpot.p99), _ms(s.queue_wait.p99),
            f"{s.mean_executed_k:.2f}", str(s.unfinished),
        )  # fmt: skip
    console = _console()
    console.print(table)
    console.print("* goodput within 1% of the best at that rate")


@cli.command("deploy")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a running local one)")
@click.option("--timeout", "timeout_s", type=float, default=None, help="seconds to wait for every arm")
@click.option(
    "--check", is_flag=True,
    help="deploy each arm with a placement probe instead of its engine (no model loaded), print which GPU every "
    "DP rank and TP worker gets, tear it down again",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="with --check: print the probes' reports as JSON")
def deploy_cmd(campaign_file: str, address: str | None, timeout_s: float | None, check: bool, as_json: bool) -> None:
    """Bring up every arm of a campaign on Ray Serve; print JSON mapping arm name -> base URL."""
    from orchestrator.deploy import DeployError, check_deploy, deploy

    campaign = _campaign(campaign_file)
    try:
        if check:
            reports = check_deploy(campaign, address=address, timeout_s=timeout_s)
        else:
            urls = deploy(campaign, address=address, timeout_s=timeout_s)
    except DeployError as exc:
        raise click.ClickException(str(exc)) from None
    if not check:
        click.echo(json.dumps(urls, indent=2))
    elif as_json:
        click.echo(json.dumps(reports, indent=2))
    else:
        _print_placement(reports)


def _print_placement(reports: dict[str, list[dict[str, Any]]]) -> None:
    table = Table(title="placement check: every arm's engine got its devices")
    for column in ("arm", "layout", "replica node", "replica GPUs", "workers -> device / bundle -> node"):
        table.add_column(column)
    for arm, replicas in reports.items():
        for report in replicas:
            if "workers" in report:
                where = ", ".join(f"dp{w['dp_rank']}/tp{w['tp_rank']}->GPU {w['device']}" for w in report["workers"])
            elif "ranks" in report:  # ray_dp: each rank's workers on the node vLLM's placement group chose
                where = ", ".join(f"dp{r['dp_rank']}/tp{t}->{w['node_id'][:8]} GPU {','.join(w['gpu_ids'])}"
                                  for r in report["ranks"] for t, w in enumerate(r["workers"]))  # fmt: skip
            elif "bundles" in report:
                where = ", ".join(f"worker {b['worker']}->{b['node_id'][:8]} GPU {','.join(b['gpu_ids'])}"
                                  for b in report["bundles"])  # fmt: skip
            else:
                where = "-"
            gpus = ",".join(report.get("replica_gpu_ids", [])) or "-"
            table.add_row(arm, report["layout"], str(report["node_id"])[:8], gpus, where)
    _console().print(table)


@cli.command("teardown")
@click.argument("campaign_file", required=False, type=click.Path(dir_okay=False))
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a running local one)")
def teardown_cmd(campaign_file: str | None, address: str | None) -> None:
    """Delete a campaign's arms (or, without a file, every Serve application)."""
    from orchestrator.deploy import DeployError, teardown

    campaign = _campaign(campaign_file) if campaign_file else None
    try:
        deleted = teardown(campaign, address=address)
    except DeployError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps({"deleted": deleted}))


@cli.command("run")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a running local one)")
@click.option("--output", default=None, help="run directory or URI (overrides the campaign's output)")
@click.option("--serve-port", type=click.IntRange(1, 65535), default=None,
              help="Ray Serve's HTTP port (overrides the campaign's serve.port)")  # fmt: skip
@click.option("--no-report", is_flag=True, help="collect traces only; `specdrill report RUN_DIR` later")
@_limit_option
@_force_lock_option
def run_cmd(
    campaign_file: str, address: str | None, output: str | None, serve_port: int | None, no_report: bool
) -> None:
    """Run a campaign: every arm x shape x repeat, traces to the run directory, then the report. One line per unit
    started and finished (a Ray job's log shows them); the progress bar only on a terminal."""
    from orchestrator.deploy import DeployError
    from orchestrator.run import run_campaign
    from serve_apps.arms import prompt_length_notice

    campaign = _campaign(campaign_file)
    if output:
        campaign = campaign.model_copy(update={"output": output})
    if serve_port is not None:
        campaign = campaign.model_copy(update={"serve": campaign.serve.model_copy(update={"port": serve_port})})
    try:
        campaign.require_traffic(real_time=True)
    except CampaignError as exc:
        _fail(str(exc))
    notice = prompt_length_notice(campaign.engine)
    if notice is not None:
        click.echo(notice)
    resume = resume_command(
        "run", campaign_file,
        [("--address", address), ("--output", output), ("--serve-port", serve_port), ("--no-report", no_report)],
    )  # fmt: skip
    try:
        store, manifest = _run_units(
            campaign, resume, lambda on_unit: run_campaign(campaign, address=address, on_unit=on_unit), virtual=False
        )
    except (DeployError, CampaignError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"run {manifest['run']}: traces in {store.traces}")
    if not no_report:
        from orchestrator.report import report_and_exit

        report_and_exit(store.root)


OnUnit = Callable[[Unit, str, UnitResult | None], None]


def _run_units(
    campaign: Campaign, resume: str, execute: Callable[[OnUnit], tuple[RunStore, dict[str, Any]]], *, virtual: bool
) -> tuple[RunStore, dict[str, Any]]:
    """Run the campaign's pending units with a line per unit (a bar as well on a terminal); on SIGINT or SIGTERM
    say how many units are complete and the command that resumes, and exit 128 + the signal's number."""
    from orchestrator.interrupts import Stopped, stop_on_signals
    from orchestrator.rundir import units_of

    units = [u for arm in campaign.arms() for u in units_of(campaign, arm)]
    existing = RunStore.existing(campaign.output_dir())
    state = CampaignProgress(
        name=campaign.name, output=campaign.output_dir(), units=units, virtual=virtual,
        complete_before=[u for u in units if existing.is_complete(u)] if existing else [],
    )  # fmt: skip
    bar = _unit_progress(campaign.name, len(units), len(state.complete_before)) if sys.stdout.isatty() else None
    announced = [False]

    def say(line: str) -> None:
        if bar is not None:
            bar.console.print(line, markup=False, highlight=False)
        else:
            click.echo(line)  # flushed: a file, a pipe or a Ray job's log shows it as it happens

    def announce() -> None:
        if not announced[0]:
            announced[0] = True
            for line in state.resumed_lines():
                say(line)

    def on_unit(unit: Unit, event: str, result: UnitResult | None) -> None:
        announce()  # the first unit runs: the run directory was accepted, so it is really being resumed
        say(state.unit_event(unit, event, result))
        if bar is not None:
            bar.update(bar.task_ids[0], description=f"{unit.arm} / {unit.shape} / repeat {unit.repeat}",
                       completed=state.started - (result is None))  # fmt: skip

    def stopped_lines(stopped: Stopped) -> None:
        now = RunStore.existing(campaign.output_dir())
        complete = {u.key for u in units if now.is_complete(u)} if now else set()
        for line in state.interrupted_lines(stopped.name, complete, resume):
            click.echo(line, err=True)

    try:
        with stop_on_signals(stopped_lines), bar if bar is not None else nullcontext():
            store, manifest = execute(on_unit)
            announce()
            if bar is not None:
                bar.update(bar.task_ids[0], completed=len(units), description=f"campaign {campaign.name}")
    except Stopped as stopped:  # said already; the arm and the load workers are stopped by now
        sys.exit(stopped.exit_code)
    return store, manifest


def _unit_progress(name: str, total: int, done: int) -> Progress:
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} units"),
        TimeElapsedColumn(), console=_console(), transient=False,
    )  # fmt: skip
    progress.add_task(f"campaign {name}", total=total, completed=done)
    return progress


@cli.command("report")
@click.argument("run_dir")
@click.option("--no-gate-exit", is_flag=True, help="exit 0 even when a gate fails (the report still says so)")
def report_cmd(run_dir: str, no_gate_exit: bool) -> None:
    """The operating map and executed-policy verdict of a run: terminal tables, report.html, summary.json."""
    from orchestrator.report import EXIT_GATE_FAILED, write_report

    summary = write_report(run_dir, console=Console(width=200))
    if not summary.passed and not no_gate_exit:
        sys.exit(EXIT_GATE_FAILED)


@cli.command("recommend")
@click.argument("run_dirs", nargs=-1, required=True)
def recommend_cmd(run_dirs: tuple[str, ...]) -> None:
    """Per batch band, the smallest k within the margin of the fastest speculative arm on the same requests,
    from the report's evidence of one run or several runs of the same traffic: a vLLM speculative_config, a
    campaign that rehearses it, and a follow-up campaign for what is missing. Exit 4: insufficient data, no
    recommendation."""
    import yaml

    from orchestrator.decide.recommend import EXIT_INSUFFICIENT, recommend_runs, vllm_snippet
    from orchestrator.decide.runs import RecommendError, load_evidence
    from orchestrator.rundir import RunStore

    try:
        runs = [load_evidence(run_dir) for run_dir in run_dirs]
        recommendation, rehearsal, followup = recommend_runs(runs)
    except RecommendError as exc:
        _fail(str(exc))
        raise
    first = runs[0]
    store = RunStore(first.run_dir, create=False)
    store.write_json("recommendation.json", recommendation.model_dump(mode="json"))
    # The run's mode decides the command: a virtual-time run rehearses in virtual time
    command = "specdrill simulate" if first.mode == "virtual" else "specdrill run"
    for name, campaign in {"recommended-campaign.yaml": rehearsal, "followup-campaign.yaml": followup}.items():
        if campaign is not None:
            store.write_text(name, yaml.safe_dump(campaign, sort_keys=False))
        elif store.exists(name):
            store.remove(name)  # an earlier recommendation's: not this one's
    click.echo(recommendation.message)
    click.echo(vllm_snippet(recommendation), nl=False)
    if rehearsal is not None:
        click.echo(recommendation.frame)
        click.echo(f"rehearse it: {command} {store.root}/recommended-campaign.yaml")
        if first.campaign.engine.kind == "simulated":
            click.echo(f"a schedule in its own frame: specdrill tune {store.root}/recommended-campaign.yaml")
        else:
            click.echo(
                f"a schedule in its own frame: specdrill calibrate {store.root} -o profile.yaml, then specdrill tune "
                "on a simulated-engine copy of the campaign with --profile profile.yaml"
            )
    else:
        click.echo("nothing to rehearse: no schedule is recommended")
    if followup is not None:
        beside = " beside the current best" if recommendation.status != "insufficient" else ""
        click.echo(f"measure what is missing{beside}: {command} {store.root}/followup-campaign.yaml")
        click.echo(f"then: specdrill recommend {' '.join(r.run_dir for r in runs)} {followup['output']}")
    if recommendation.status == "insufficient":
        sys.exit(EXIT_INSUFFICIENT)


@cli.command("tune")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--profile", "profile_name", default=None,
              help="a shipped profile or a profile YAML (a fitted one); default: the campaign's")  # fmt: skip
@click.option("--objective", "objective_text", default="tpot", show_default=True,
              help="after SLO goodput: tpot, ttft or e2e, with a percentile (ttft:p99; default p50)")  # fmt: skip
@click.option("--seeds", default=3, show_default=True, type=click.IntRange(1, 50), help="repeats of the traffic")
@click.option("--max-k", default=None, type=click.IntRange(1, 16), help="default: the campaign's largest k")
@click.option("--budget", default=600, show_default=True, type=click.IntRange(2, 100_000),
              help="candidate schedules to simulate at most")  # fmt: skip
@click.option("-o", "--output", "out_dir", default=None, help="directory for the files (default runs/<name>-tune)")
@_limit_option
def tune_cmd(
    campaign_file: str, profile_name: str | None, objective_text: str, seeds: int, max_k: int | None, budget: int,
    out_dir: str | None,
) -> None:  # fmt: skip
    """Search vLLM schedules (k per batch range) in virtual time on the campaign's own traffic: the schedule as
    vLLM's speculative_config, the predicted operating map against the campaign's arms, a rehearsal campaign."""
    from pathlib import Path

    from orchestrator.decide.scoring import Objective
    from orchestrator.decide.tune_outputs import run_tune
    from orchestrator.simulate_campaign import require_simulated

    campaign = _campaign(campaign_file)
    try:
        objective = Objective.parse(objective_text)
        require_simulated(campaign)
        if profile_name is not None:
            _profile(profile_name)
        # Tune holds every seed's traffic at once
        campaign.model_copy(update={"repeats": seeds}).require_traffic(all_units_at_once=True)
        directory = Path(out_dir or f"runs/{campaign.name}-tune")
        _output_directory(str(directory), "tune output directory")  # before the search, not after it
        outputs = run_tune(
            campaign, profile=profile_name, objective=objective, seeds=seeds, max_k=max_k, budget=budget,
            out_dir=directory,
        )  # fmt: skip
    except (CampaignError, ValueError) as exc:
        _fail(str(exc))
        raise
    for line in outputs.lines:
        click.echo(line)


@cli.command("search")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--arm", "arm", required=True, help="the arm (or its policy) whose crossover against `off` is sought")
@click.option("--against", default="off", show_default=True, help="the `off` arm (or policy) it is compared with")
@click.option("-o", "--output", "out_dir", default=None, help="the run directory (default runs/<name>-search-<arm>)")
@click.option("--budget-requests", default=None, type=click.IntRange(1), help="requests to both arms, all units")
@click.option("--low", default=None, type=click.FloatRange(min=0, min_open=True),
              help="the first low rate, req/s (default: the campaign's shapes' lowest)")  # fmt: skip
@click.option("--high", default=None, type=click.FloatRange(min=0, min_open=True),
              help="the first high rate, req/s (default: the campaign's shapes' highest)")  # fmt: skip
@click.option("--unit-requests", default=150, show_default=True, type=click.IntRange(20),
              help="requests per arm in one unit")  # fmt: skip
@click.option("--tolerance", default=0.10, show_default=True, type=click.FloatRange(min=0.01, max=1),
              help="the bracket's width (high / low - 1) that ends the search")  # fmt: skip
@click.option("--min-rate", default=None, type=click.FloatRange(min=0, min_open=True),
              help="widening stops here (default: the low rate / 4)")  # fmt: skip
@click.option("--max-rate", default=None, type=click.FloatRange(min=0, min_open=True),
              help="widening stops here (default: the high rate x 4)")  # fmt: skip
@click.option("--real-time", is_flag=True, help="run the units on Ray (`specdrill run`'s runner), not in virtual time")
@click.option("--address", default=None, help="--real-time: Ray cluster address (default: RAY_ADDRESS or local)")
@_limit_option
@_force_lock_option
def search_cmd(
    campaign_file: str,
    arm: str,
    against: str,
    out_dir: str | None,
    budget_requests: int | None,
    low: float | None,
    high: float | None,
    unit_requests: int,
    tolerance: float,
    min_rate: float | None,
    max_rate: float | None,
    real_time: bool,
    address: str | None,
) -> None:
    """Find the offered rate where ARM stops helping against `off`: paired units at constant rates, widened until
    the deciding ratio falls below 1, then narrowed on its PCHIP interpolant until the bracket is within the
    tolerance or the budget is spent. Every unit is kept in the run directory (`specdrill report` reads it)."""
    from pydantic import ValidationError

    from orchestrator.decide.search import SearchConfig
    from orchestrator.search_run import default_rates, run_search
    from serve_apps.config_io import first_error

    campaign = _campaign(campaign_file)
    try:
        if low is None or high is None:
            first, last = default_rates(campaign)
            low, high = low or first, high or last
        config = SearchConfig(
            low=low,
            high=high,
            min_rate=min_rate or low / 4,
            max_rate=max_rate or high * 4,
            unit_requests=unit_requests,
            tolerance=tolerance,
            budget_requests=budget_requests,
        )
        campaign.require_search_size(unit_requests=unit_requests, rate=config.max_rate,
                                     budget_requests=budget_requests, real_time=real_time)  # fmt: skip
        slug = "".join(c if c.isalnum() or c == "-" else "-" for c in arm.lower())
        run_search(
            campaign, arm=arm, against=against, output=out_dir or f"runs/{campaign.name}-search-{slug}",
            config=config, mode="real" if real_time else "virtual", address=address, echo=click.echo,
        )  # fmt: skip
    except ValidationError as exc:
        _fail(first_error(exc))
    except CampaignError as exc:
        _fail(str(exc))


@cli.group("models")
def models() -> None:
    """The models a vLLM campaign loads (target and drafters)."""


@models.command("pull")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a running local one)")
@click.option("--here", is_flag=True, help="pull into this machine's cache only, without Ray")
def models_pull_cmd(campaign_file: str, address: str | None, here: bool) -> None:
    """Download the campaign's target and drafter models into the Hugging Face cache (HF_HOME) of every GPU node,
    one Ray task per node; HF_TOKEN is read from each node's environment. Local paths are skipped."""
    from orchestrator.deploy import DeployError, connect
    from serve_apps.engines.vllm_support import ModelPullError, campaign_models, pull_here, pull_on_gpu_nodes

    try:
        wanted = campaign_models(_campaign(campaign_file))
        if here:
            for pulled in pull_here(wanted):
                click.echo(f"{pulled.model}: {pulled.path or 'skipped (' + str(pulled.skipped) + ')'}")
            return
        connect(address)
        outcomes = pull_on_gpu_nodes(wanted)
    except (ModelPullError, DeployError) as exc:
        raise click.ClickException(str(exc)) from None
    failed = []
    for node_id, outcome in outcomes.items():
        where = f"{outcome['host']} ({node_id[:8]})"
        if "error" in outcome:
            failed.append(f"{where}: {outcome['error']}")
            continue
        for pulled in outcome["models"]:
            click.echo(f"{where} {pulled['model']}: {pulled['path'] or 'skipped (' + pulled['skipped'] + ')'}")
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(outcomes)} nodes failed; " + "; ".join(failed))


def _campaign(path: str) -> Campaign:
    try:
        campaign = load_campaign(path)
    except CampaignError as exc:
        _fail(str(exc))
        raise
    for line in campaign.warnings():
        click.echo(f"specdrill: warning: {line}", err=True)
    return campaign


def main(argv: Sequence[str] | None = None) -> None:
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # a file or a pipe gets each line as it is printed
    import signal

    from orchestrator.interrupts import SIGNALS, Stopped, stop_on_signals

    try:
        # Ctrl-C or SIGTERM anywhere (a report's DuckDB query included, which turns it into its own error): one
        # line and 128 + the signal's number, as a campaign's units say it (they say more: how far they got).
        with stop_on_signals():
            cli.main(args=list(argv) if argv is not None else None, prog_name="specdrill", standalone_mode=False)
    except Stopped as stopped:
        click.echo(f"specdrill: interrupted ({stopped.name})", err=True)
        sys.exit(stopped.exit_code)
    except click.UsageError as exc:
        click.echo(f"specdrill: error: {exc.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except BadFileError as exc:  # a file a command read or wrote, named with what is wrong with it
        click.echo(f"specdrill: error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        click.echo(f"specdrill: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:  # Ctrl-C outside a campaign's units (those say how far they got)
        click.echo("specdrill: interrupted", err=True)
        sys.exit(130)
    finally:
        if argv is None:  # the process's own command, done: a signal now would only print a traceback on exit
            for signum in SIGNALS:
                signal.signal(signum, signal.SIG_IGN)


@cli.command("calibrate")
@click.argument("run_dirs", nargs=-1)
@click.option("-o", "--output", required=True, help="the fitted profile (YAML) to write")
@click.option("--from-vllm-profile", "vllm_profile", default=None,
              help="import vLLM's offline dynamic-speculation profile (JSON) instead of fitting runs")
@click.option("--base", default=None, help="profile whose limits and names the fitted one keeps (default: the run's)")
@click.option("--name", default=None, help="the fitted profile's name (default: the output file's stem)")
@click.option("--context-tokens", default=1024, show_default=True, help="--from-vllm-profile: KV tokens per request")
@click.option("--categories", default="chat,reasoning,editing", show_default=True,
              help="--from-vllm-profile: the workload categories its acceptance vector is written for")
@click.option("--repeats", "repeats_text", default=None,
              help="fit on these repeats only (e.g. 0,1); the prediction check compares the others, held out")
@click.option("--no-check", is_flag=True, help="skip the prediction check (the run replayed on the fitted profile)")
def calibrate_cmd(run_dirs: tuple[str, ...], output: str, vllm_profile: str | None, base: str | None,
                  name: str | None, context_tokens: int, categories: str, repeats_text: str | None,
                  no_check: bool) -> None:  # fmt: skip
    """Fit a simulator profile from measured runs' step timelines and speculation counters (or import vLLM's
    offline profiler output), print the fit's quality per arm, and write it for `engine.profile`."""
    from pathlib import Path

    from orchestrator.calibrate.command import calibrate
    from orchestrator.calibrate.model import CalibrationError
    from orchestrator.calibrate.vllm_profile import VllmProfileError, profile_from_vllm
    from orchestrator.calibrate.writer import write_profile

    stem = name or Path(output).stem
    _output_directory(os.path.dirname(output) or ".", "directory of the fitted profile")  # before the fit
    repeats = None
    if repeats_text is not None:
        try:
            repeats = {int(r) for r in repeats_text.split(",") if r.strip()}
        except ValueError:
            _fail(f"--repeats: {repeats_text!r} is not a list of repeat numbers (e.g. 0,1)")
    separate: dict[str, Any] = {}
    try:
        if vllm_profile is not None:
            if run_dirs:
                _fail("give run directories or --from-vllm-profile, not both")
            profile = profile_from_vllm(vllm_profile, _profile(base or "llama3.1-8b-h100-eagle"), name=stem,
                                        context_tokens=context_tokens,
                                        categories=[c for c in categories.split(",") if c])  # fmt: skip
            lines = list(profile.provenance.notes if profile.provenance else [])
        else:
            if not run_dirs:
                _fail("give at least one run directory (or --from-vllm-profile FILE)")
            result = calibrate(run_dirs, name=stem, base=base, repeats=repeats, check=not no_check)
            profile, lines, separate = result.profile, result.lines, result.separate
    except (CalibrationError, VllmProfileError, ProfileError, FileNotFoundError) as exc:
        _fail(str(exc))
        raise
    for line in lines:
        click.echo(line)
    if separate:
        target = Path(output)
        for run_id, own in separate.items():
            path = str(target.with_name(f"{target.stem}.{run_id}{target.suffix}"))
            try:
                write_profile(own, path)
            except OSError as exc:
                raise write_failed(path, exc) from None
            click.echo(f"wrote {path} (run {run_id} alone)")
        click.echo(f"not written: {output} (the engines differ: one pooled profile would speak for none of them)")
        return
    try:
        write_profile(profile, output)
    except OSError as exc:
        raise write_failed(output, exc) from None
    click.echo(f"wrote {output}")


def _output_directory(path: str, what: str) -> None:
    """The directory a command writes into exists or is created, or one line says why not (a regular file in the
    way, /proc), before the command spends any time."""
    make_directory(LocalFileSystem(), os.path.abspath(path), what)
