"""`specdrill run`: a campaign on Ray, real time."""

from __future__ import annotations

import click

from orchestrator.cli.common import campaign_of, fail, force_lock_option, limit_option
from orchestrator.cli.units import with_unit_lines
from orchestrator.execute.progress import resume_command
from orchestrator.plan.campaign import CampaignError


@click.command("run")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a running local one)")
@click.option("--output", default=None, help="run directory or URI (overrides the campaign's output)")
@click.option("--serve-port", type=click.IntRange(1, 65535), default=None,
              help="Ray Serve's HTTP port (overrides the campaign's serve.port)")  # fmt: skip
@click.option("--no-report", is_flag=True, help="collect traces only; `specdrill report RUN_DIR` later")
@limit_option
@force_lock_option
def run_cmd(
    campaign_file: str, address: str | None, output: str | None, serve_port: int | None, no_report: bool
) -> None:
    """Run a campaign: every arm x shape x repeat, traces to the run directory, then the report. One line per unit
    started and finished (a Ray job's log shows them); the progress bar only on a terminal."""
    from orchestrator.execute.deploy import DeployError, NoRayCluster
    from orchestrator.execute.ray_executor import run_campaign
    from serve_apps.arms import prompt_length_notice

    campaign = campaign_of(campaign_file)
    if output:
        campaign = campaign.model_copy(update={"output": output})
    if serve_port is not None:
        campaign = campaign.model_copy(update={"serve": campaign.serve.model_copy(update={"port": serve_port})})
    try:
        campaign.require_traffic(real_time=True)
    except CampaignError as exc:
        fail(str(exc))
    notice = prompt_length_notice(campaign.engine)
    if notice is not None:
        click.echo(notice)
    for line in campaign.generated_text_lines():
        click.echo(line)  # with the prompt-length notice: the run's first lines, not an error
    resume = resume_command(
        "run", campaign_file,
        [("--address", address), ("--output", output), ("--serve-port", serve_port), ("--no-report", no_report)],
    )  # fmt: skip
    try:
        store, manifest = with_unit_lines(
            campaign, resume, lambda on_unit: run_campaign(campaign, address=address, on_unit=on_unit), virtual=False
        )
    except NoRayCluster as exc:  # the address given: a bad argument
        fail(str(exc))
        raise
    except (DeployError, CampaignError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"run {manifest['run']}: traces in {store.traces}")
    if not no_report:
        from orchestrator.report.build import report_and_exit

        report_and_exit(store.root)
