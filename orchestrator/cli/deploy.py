"""The Ray Serve side of a campaign: `deploy` (and its placement check), `teardown`, `models pull`."""

from __future__ import annotations

import json
from typing import Any, NoReturn

import click
from rich.table import Table

from orchestrator.cli.common import campaign_of, console, fail


@click.command("deploy")
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
    from orchestrator.execute.deploy import DeployError, check_deploy, deploy

    campaign = campaign_of(campaign_file)
    try:
        if check:
            reports = check_deploy(campaign, address=address, timeout_s=timeout_s)
        else:
            urls = deploy(campaign, address=address, timeout_s=timeout_s)
    except DeployError as exc:
        refused(exc)
    if not check:
        click.echo(json.dumps(urls, indent=2))
    elif as_json:
        click.echo(json.dumps(reports, indent=2))
    else:
        _print_placement(reports)


def refused(exc: Exception) -> NoReturn:
    """One line: exit 2 where the address given reaches no cluster (a bad argument), else 1."""
    from orchestrator.execute.deploy import NoRayCluster

    if isinstance(exc, NoRayCluster):
        fail(str(exc))
    raise click.ClickException(str(exc)) from None


def _print_placement(reports: dict[str, list[dict[str, Any]]]) -> None:
    table = Table(title="placement check: every arm's engine got its devices")
    columns = (
        "arm", "layout", "replica node", "replica GPUs", "workers -> device / bundle -> node",
        "vLLM runner executor: schedule",
    )  # fmt: skip
    for column in columns:
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
            table.add_row(arm, report["layout"], str(report["node_id"])[:8], gpus, where, speculation_cell(report))
    console().print(table)


def speculation_cell(report: dict[str, Any]) -> str:
    """The replica's vLLM, model runner and executor, and the schedule drop it predicts with its cause (or none)."""
    spec = report.get("speculation")
    if not spec:
        return "-"
    dropped = spec.get("schedule_dropped")
    said = " ".join(str(spec[k]) for k in ("vllm", "model_runner", "executor") if spec.get(k))
    return f"{said}: " + (f"drops the schedule: {dropped}" if dropped else "as written")


@click.command("teardown")
@click.argument("campaign_file", required=False, type=click.Path(dir_okay=False))
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a running local one)")
def teardown_cmd(campaign_file: str | None, address: str | None) -> None:
    """Delete a campaign's arms (or, without a file, every Serve application)."""
    from orchestrator.execute.deploy import DeployError, teardown

    campaign = campaign_of(campaign_file) if campaign_file else None
    try:
        deleted = teardown(campaign, address=address)
    except DeployError as exc:
        refused(exc)
    click.echo(json.dumps({"deleted": deleted}))


@click.group("models")
def models() -> None:
    """The models a vLLM campaign loads (target and drafters)."""


@models.command("pull")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a running local one)")
@click.option("--here", is_flag=True, help="pull into this machine's cache only, without Ray")
def models_pull_cmd(campaign_file: str, address: str | None, here: bool) -> None:
    """Download the campaign's target and drafter models into the Hugging Face cache (HF_HOME) of every GPU node,
    one Ray task per node; HF_TOKEN is read from each node's environment. Local paths are skipped."""
    from orchestrator.execute.deploy import DeployError, connect
    from serve_apps.engines.vllm_support import ModelPullError, campaign_models, pull_here, pull_on_gpu_nodes

    try:
        wanted = campaign_models(campaign_of(campaign_file))
        if here:
            for pulled in pull_here(wanted):
                click.echo(f"{pulled.model}: {pulled.path or 'skipped (' + str(pulled.skipped) + ')'}")
            return
        connect(address)
        outcomes = pull_on_gpu_nodes(wanted)
    except (ModelPullError, DeployError) as exc:
        refused(exc)
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
