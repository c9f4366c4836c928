"""`specdrill simulate`: a campaign in virtual time (`simulate CAMPAIGN.yaml`) and the simulator's experiments
(fixed-batch, oracle, sweep) with their tables."""

from __future__ import annotations

import json
from collections.abc import Sequence

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from loadshapes.slo import SloConfig
from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.cli.common import (
    campaign_of,
    console,
    fail,
    float_list,
    force_lock_option,
    int_list,
    limit_option,
    policy_of,
    profile_named,
    topology_of,
    workload_named,
)
from orchestrator.cli.oracle_setup import (
    DEFAULT_MAX_K,
    DEFAULT_PROFILE,
    DEFAULT_WORKLOAD,
    oracle_setup,
)
from orchestrator.cli.units import with_unit_lines
from orchestrator.execute.progress import resume_command
from orchestrator.plan.campaign import CampaignError
from orchestrator.virtual.experiments import FixedBatchPoint, SweepPoint, fixed_batch, sweep
from serve_apps.policies import split_policy_list


class SimulateGroup(click.Group):
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


@click.group(cls=SimulateGroup)
def simulate() -> None:
    """Offline runs on the calibrated simulated engine (virtual time): `specdrill simulate CAMPAIGN.yaml`
    runs a whole campaign (same traces and report as `specdrill run`); fixed-batch and sweep are experiments."""


@simulate.command("campaign")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--output", default=None, help="run directory or URI (overrides the campaign's output)")
@click.option("--no-report", is_flag=True, help="traces only; `specdrill report RUN_DIR` later")
@limit_option
@force_lock_option
def simulate_campaign_cmd(campaign_file: str, output: str | None, no_report: bool) -> None:
    """A campaign in virtual time on the simulated engine: no Ray, no HTTP, the same run directory. One line per
    unit started and finished; rerun it to resume (complete units are skipped)."""
    from orchestrator.virtual.campaign import simulate_campaign

    campaign = campaign_of(campaign_file)
    if output:
        campaign = campaign.model_copy(update={"output": output})
    resume = resume_command("simulate", campaign_file, [("--output", output), ("--no-report", no_report)])
    try:
        store, manifest = with_unit_lines(
            campaign, resume, lambda on_unit: simulate_campaign(campaign, on_unit=on_unit), virtual=True
        )
    except CampaignError as exc:
        fail(str(exc))
        raise
    click.echo(f"run {manifest['run']} (virtual time): traces in {store.traces}")
    if not no_report:
        from orchestrator.report.build import report_and_exit

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
    profile = profile_named(profile_name)
    policy = policy_of(policy_text, profile)
    sizes = int_list(batch_sizes, "--batch-sizes")
    if max(sizes) > profile.limits.max_num_seqs:
        fail(f"--batch-sizes: {max(sizes)} exceeds the profile's max_num_seqs {profile.limits.max_num_seqs}")
    workload = workload_named(workload_name, profile)
    topology = topology_of(topology_text)
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
    for col in ("batch", "policy tok/s", "off tok/s", "speedup", "mean k", "accept len"):
        table.add_column(col, justify="right")
    for p in points:
        mal = "-" if p.mean_acceptance_length is None else f"{p.mean_acceptance_length:.2f}"
        table.add_row(
            str(p.batch_size), f"{p.policy_tokens_per_s:,.0f}", f"{p.off_tokens_per_s:,.0f}", f"{p.speedup:.2f}x",
            f"{p.mean_executed_k:.2f}", mal,
        )  # fmt: skip
    out = console()
    out.print(table)
    if any(p.mean_acceptance_length is None for p in points):
        out.print("accept len -: no step verified a draft at that batch size (k = 0 there): nothing was accepted")


@simulate.command("oracle")
@click.option("--campaign", "campaign_file", default=None, type=click.Path(dir_okay=False),
              help="take the profile, the workload (the mix's heaviest) and the largest k from this campaign, as "
              "`tune` and the ground-truth checks do")  # fmt: skip
@click.option("--profile", "profile_name", default=None,
              help=f"default: the campaign's, else {DEFAULT_PROFILE}")  # fmt: skip
@click.option(
    "--workload",
    "workload_name",
    default=None,
    help=f"a built-in workload; default: the campaign's heaviest, else {DEFAULT_WORKLOAD} (the default mix)",
)
@click.option("--max-k", default=None, type=click.IntRange(1, 16),
              help=f"largest k to try; default: the campaign's largest, else {DEFAULT_MAX_K}; at most the profile's "
              "limits.max_draft_tokens")  # fmt: skip
@click.option("--batch-sizes", default=None, help="comma-separated (default: 1 to the profile's max_num_seqs)")
@click.option("--tolerance", default=MapSettings().margin, show_default=True, type=click.FloatRange(0, 1),
              help="k within this fraction of the best per-token latency count as tied: the analysis margin, "
              "as recommend, tune and the ground-truth checks use")  # fmt: skip
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def oracle_cmd(
    campaign_file: str | None,
    profile_name: str | None,
    workload_name: str | None,
    max_k: int | None,
    batch_sizes: str | None,
    tolerance: float,
    seed: int,
    as_json: bool,
) -> None:
    """Ground truth: the k that minimises per-token latency at each batch size (fixed-batch runs, k = 0..max-k)."""
    from orchestrator.decide.oracle import DEFAULT_BATCH_SIZES, oracle

    setup = oracle_setup(campaign_file, profile_name, workload_name, max_k)
    profile, workload, max_k = setup.profile, setup.workload, setup.max_k
    sizes = int_list(batch_sizes, "--batch-sizes") if batch_sizes else list(DEFAULT_BATCH_SIZES)
    if min(sizes) > profile.limits.max_num_seqs:
        fail(f"--batch-sizes: all exceed the profile's max_num_seqs {profile.limits.max_num_seqs}")
    result = oracle(profile, workload=workload, max_k=max_k, batch_sizes=sizes, seed=seed, tolerance=tolerance)
    said = (
        f"oracle of {profile.name} on workload {workload.name} ({setup.workload_from}), k = 0..{max_k} "
        f"({setup.max_k_from}), ties within {tolerance:.0%}"
        + (" (the analysis margin recommend and tune use)" if tolerance == MapSettings().margin else "")
    )
    if as_json:
        click.echo(json.dumps({**result.model_dump(mode="json"), "schedule": result.schedule()}, indent=2))
        click.echo(said, err=True)
        return
    table = Table(title=f"{profile.name} / {workload.name}: per-token latency p50 (ms) at fixed batch sizes")
    for col in ("batch", *(f"k={k}" for k in range(max_k + 1)), "best k", f"within {tolerance:.0%}"):
        table.add_column(col, justify="right")
    for p in result.points:
        table.add_row(
            str(p.batch_size), *(f"{p.tpot_p50_s[k] * 1e3:.2f}" for k in range(max_k + 1)), str(p.best_k),
            ",".join(str(k) for k in p.near_best),
        )  # fmt: skip
    console().print(table)
    click.echo(said)
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
    profile = profile_named(profile_name)
    parsed = [policy_of(text, profile) for text in split_policy_list(policies)]
    if not parsed:
        fail("--policies: give at least one policy")
    rate_list = float_list(rates, "--rates")
    if not duration > 0:
        fail(f"--duration must be > 0, got {duration}")
    if not (ttft_slo > 0 and tpot_slo > 0):
        fail("--ttft-slo and --tpot-slo must be > 0")
    workload = workload_named(workload_name, profile)
    topology = topology_of(topology_text)
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
    out = console()
    out.print(table)
    out.print("* goodput within 1% of the best at that rate")
