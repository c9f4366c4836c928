"""`specdrill calibrate`: a simulator profile fitted from measured runs (or imported from vLLM's profiler)."""

from __future__ import annotations

import os

import click

from orchestrator.cli.common import fail, output_directory, profile_named
from serve_apps.sim.profile import Profile, ProfileError


@click.command("calibrate")
@click.argument("run_dirs", nargs=-1)
@click.option("-o", "--output", required=True, help="the fitted profile (YAML) to write")
@click.option(
    "--from-vllm-profile",
    "vllm_profile",
    default=None,
    help="import vLLM's offline dynamic-speculation profile (JSON) instead of fitting runs",
)
@click.option(
    "--from-vllm-bench-forward",
    "bench_forward",
    multiple=True,
    help="import `vllm bench forward --output-json` results (repeatable: one file per run) instead of fitting runs",
)
@click.option("--base", default=None, help="profile whose limits and names the fitted one keeps (default: the run's)")
@click.option("--name", default=None, help="the fitted profile's name (default: the output file's stem)")
@click.option("--context-tokens", default=1024, show_default=True, help="--from-vllm-profile: KV tokens per request")
@click.option(
    "--categories",
    default="chat,reasoning,editing",
    show_default=True,
    help="--from-vllm-profile: the workload categories its acceptance vector is written for",
)
@click.option(
    "--repeats",
    "repeats_text",
    default=None,
    help="fit on these repeats only (e.g. 0,1); the prediction check compares the others, held out",
)
@click.option("--no-check", is_flag=True, help="skip the prediction check (the run replayed on the fitted profile)")
def calibrate_cmd(run_dirs: tuple[str, ...], output: str, vllm_profile: str | None, bench_forward: tuple[str, ...],
                  base: str | None, name: str | None, context_tokens: int, categories: str, repeats_text: str | None,
                  no_check: bool) -> None:  # fmt: skip
    """Fit a simulator profile from measured runs' step timelines and speculation counters (or import vLLM's
    offline profiler output or its `bench forward` step timings), print the fit's quality per arm (per case for
    bench forward), and write it for `engine.profile`."""
    from pathlib import Path

    from orchestrator.analysis.steps.step_model import CalibrationError
    from orchestrator.calibrate.bench_forward import BenchForwardError, profile_from_bench_forward
    from orchestrator.calibrate.command import calibrate
    from orchestrator.calibrate.outputs import write_profiles
    from orchestrator.calibrate.vllm_profile import VllmProfileError, profile_from_vllm

    stem = name or Path(output).stem
    output_directory(os.path.dirname(output) or ".", "directory of the fitted profile")  # before the fit
    repeats = None
    if repeats_text is not None:
        try:
            repeats = {int(r) for r in repeats_text.split(",") if r.strip()}
        except ValueError:
            fail(f"--repeats: {repeats_text!r} is not a list of repeat numbers (e.g. 0,1)")
    separate: dict[str, Profile] = {}
    if sum(bool(x) for x in (run_dirs, vllm_profile, bench_forward)) > 1:
        fail("give one of: run directories, --from-vllm-profile, --from-vllm-bench-forward")
    try:
        if bench_forward:
            imported = profile_from_bench_forward(list(bench_forward), profile_named(base or "llama3.1-8b-h100-eagle"),
                                                  name=stem)  # fmt: skip
            profile, lines = imported.profile, imported.lines
        elif vllm_profile is not None:
            profile = profile_from_vllm(vllm_profile, profile_named(base or "llama3.1-8b-h100-eagle"), name=stem,
                                        context_tokens=context_tokens,
                                        categories=[c for c in categories.split(",") if c])  # fmt: skip
            lines = list(profile.provenance.notes if profile.provenance else [])
        else:
            if not run_dirs:
                fail("give at least one run directory (or --from-vllm-profile FILE, --from-vllm-bench-forward FILE)")
            result = calibrate(run_dirs, name=stem, base=base, repeats=repeats, check=not no_check)
            profile, lines, separate = result.profile, result.lines, result.separate
    except (CalibrationError, VllmProfileError, BenchForwardError, ProfileError, FileNotFoundError) as exc:
        fail(str(exc))
        raise
    for line in lines:
        click.echo(line)
    write_profiles(profile, separate, output, click.echo)
