"""The decisions: `recommend` (a schedule from measured runs), `tune` (one searched in virtual time), `search`
(the rate where an arm stops helping)."""

from __future__ import annotations

import sys

import click

from orchestrator.cli.common import campaign_of, fail, force_lock_option, limit_option, output_directory, profile_named
from orchestrator.plan.campaign import Campaign, CampaignError


@click.command("recommend")
@click.argument("run_dirs", nargs=-1, required=True)
@click.option("--topology", "topology_text", default=None,
              help="answer for this deployment too: data_parallel:N (vLLM runs one static k there)")  # fmt: skip
def recommend_cmd(run_dirs: tuple[str, ...], topology_text: str | None) -> None:
    """Per batch band, the smallest k within the margin of the fastest speculative arm on the same requests,
    from the report's evidence of one run or several runs of the same traffic: a vLLM speculative_config, a
    campaign that rehearses it, and a follow-up campaign for what is missing; for a data-parallel deployment
    (the runs' data-parallel arms, or --topology), the static k vLLM will run there. Exit 4: insufficient data,
    no recommendation."""
    from orchestrator.decide.recommend.build import EXIT_INSUFFICIENT, recommend_runs
    from orchestrator.decide.recommend.outputs import write_recommendation
    from orchestrator.decide.recommend.runs import RecommendError, load_evidence
    from serve_apps.policies import parse_topology

    try:
        topology = parse_topology(topology_text) if topology_text is not None else None
        if topology is not None and topology.kind == "replicas":
            raise RecommendError(
                f"--topology {topology_text}: replicas each apply the one-engine schedule recommend gives; "
                "--topology answers for data_parallel:N (where vLLM drops the schedule)"
            )
        runs = [load_evidence(run_dir) for run_dir in run_dirs]
        recommendation, rehearsal, followup = recommend_runs(runs, topology)
    except (RecommendError, ValueError) as exc:
        fail(str(exc))
        raise
    click.echo(write_recommendation(runs, recommendation, rehearsal, followup), nl=False)
    if recommendation.status == "insufficient":
        sys.exit(EXIT_INSUFFICIENT)


@click.command("tune")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--profile", "profile_name", default=None,
              help="a shipped profile or a profile YAML (a fitted one); default: the campaign's")  # fmt: skip
@click.option("--objective", "objective_text", default="tpot", show_default=True,
              help="after SLO goodput: tpot, ttft or e2e, with a percentile (ttft:p99; default p50)")  # fmt: skip
@click.option("--seeds", default=3, show_default=True, type=click.IntRange(1, 50), help="repeats of the traffic")
@click.option("--max-k", default=None, type=click.IntRange(1, 16), help="default: the campaign's largest k")
@click.option("--budget", default=600, show_default=True, type=click.IntRange(2, 100_000),
              help="candidate schedules to simulate at most")  # fmt: skip
@click.option("--topology", "topology", default=None,
              help="single, replicas:N or data_parallel:N (default: the campaign's speculative arms'; data parallel: "
                   "the best static k, vLLM drops schedules there)")  # fmt: skip
@click.option("-o", "--output", "out_dir", default=None, help="directory for the files (default runs/<name>-tune)")
@click.option("--design", "designs", multiple=True,
              type=click.Choice(["vllm_schedule", "sglang_adaptive", "trtllm_schedule", "trtllm_max_concurrency",
                                 "trtllm_acceptance_gate", "all"]),
              help="tune this engine's design instead (repeatable; all: every one): its best configuration on "
                   "the campaign's traffic per offered-rate band on the topology answered for (where the engine "
                   "drops the design to a static k, the best static k), the oracle's beside it, which design wins "
                   "where",
              )  # fmt: skip
@limit_option
def tune_cmd(
    campaign_file: str, profile_name: str | None, objective_text: str, seeds: int, max_k: int | None, budget: int,
    topology: str | None, out_dir: str | None, designs: tuple[str, ...],
) -> None:  # fmt: skip
    """Search vLLM schedules (k per batch range) in virtual time on the campaign's own traffic, for the topology
    it will be served on: the answer as vLLM's speculative_config (on data_parallel:N the best static k, with
    what a schedule on N replicas would gain), the predicted operating map against the campaign's arms, a
    rehearsal campaign."""
    from pathlib import Path

    from orchestrator.decide.scoring import Objective
    from orchestrator.decide.tune.outputs import run_tune
    from orchestrator.decide.tune.progress import TuneProgress
    from orchestrator.decide.tune.topology import choose_topology
    from orchestrator.virtual.campaign import require_simulated

    campaign = campaign_of(campaign_file)
    if designs:
        _tune_designs(campaign, profile_name, objective_text, seeds, max_k, designs, topology)
        return
    try:
        objective = Objective.parse(objective_text)
        require_simulated(campaign)
        if profile_name is not None:
            profile_named(profile_name)
        choose_topology(campaign, topology)  # a bad --topology before the search, not after it
        # Tune holds every seed's traffic at once
        campaign.model_copy(update={"repeats": seeds}).require_traffic(all_units_at_once=True)
        directory = Path(out_dir or f"runs/{campaign.name}-tune")
        output_directory(str(directory), "tune output directory")  # before the search, not after it
        # While it searches (minutes), a line per stage and every few seconds to stderr: stdout is the answer.
        progress = TuneProgress(say=lambda line: click.echo(line, err=True))
        outputs = run_tune(
            campaign, profile=profile_name, objective=objective, seeds=seeds, max_k=max_k, budget=budget,
            out_dir=directory, topology=topology, progress=progress,
        )  # fmt: skip
    except (CampaignError, ValueError) as exc:
        fail(str(exc))
        raise
    for line in outputs.lines:
        click.echo(line)


def _tune_designs(
    campaign: Campaign, profile_name: str | None, objective_text: str, seeds: int, max_k: int | None,
    designs: tuple[str, ...], topology: str | None,
) -> None:  # fmt: skip
    from orchestrator.decide.scoring import Objective
    from orchestrator.decide.tune.designs import DESIGNS, tune_designs
    from orchestrator.decide.tune.designs_words import words
    from orchestrator.decide.tune.outputs import with_profile
    from orchestrator.virtual.campaign import require_simulated

    chosen = list(DESIGNS) if "all" in designs else [d for d in DESIGNS if d in designs]
    try:
        require_simulated(campaign)
        if profile_name is not None:
            profile_named(profile_name)  # a bad --profile in words
        campaign, profile, _ = with_profile(campaign, profile_name)
        result = tune_designs(campaign, profile, chosen, seeds=seeds, max_k=max_k,
                              objective=Objective.parse(objective_text), topology=topology)  # fmt: skip
    except (CampaignError, ValueError) as exc:
        fail(str(exc))
        raise
    for line in words(result):
        click.echo(line)


@click.command("search")
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
@limit_option
@force_lock_option
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
    the deciding ratio falls below 1, narrowed on its PCHIP interpolant, then settled: each unit is a traffic
    sample, a rate's interval is taken across its samples, and rates get more samples until the bracket's ends
    decide, it is within the tolerance or the budget is spent. Every unit is kept in the run directory
    (`specdrill report` reads it)."""
    from pydantic import ValidationError

    from orchestrator.search.bracket import SearchConfig
    from orchestrator.search.run import default_rates, run_search
    from serve_apps.config_io import first_error

    campaign = campaign_of(campaign_file)
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
        fail(first_error(exc))
    except CampaignError as exc:
        fail(str(exc))
