"""A simulated engine's `time_scale`, said wherever a run's numbers are read: every engine step takes `scale` times
its profile's time (in real and virtual time alike), so a run's latencies are `scale` times the modelled GPU's and
its offered rates 1/scale of the load the modelled GPU would carry as they do. calibrate divides by it to fit in the
hardware's own seconds."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from orchestrator.plan.campaign import Campaign
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.sim.profile import ProfileError


class TimeScale(BaseModel):
    """summary.json `time_scale`: present where the run's engine is simulated at a time_scale other than 1."""

    model_config = ConfigDict(frozen=True)
    scale: float
    profile: str
    hardware: str | None  # the profile's hardware, None where its file can no longer be read
    line: str


def engine_time_scale(campaign: Campaign) -> float:
    """The factor between a run's wall seconds and its engine's modelled seconds: 1 for any engine not simulated."""
    scaled = kind_of(campaign.engine).time_scale(campaign.engine)
    return 1.0 if scaled is None else scaled[0]


def _hardware(campaign: Campaign) -> str | None:
    # The engine's own simulation: the profile the campaign was loaded with, not its file read once more
    try:
        simulation = kind_of(campaign.engine).simulation(campaign.engine)
    except (ProfileError, OSError):  # moved or deleted since the run: the line names the profile only
        return None
    return simulation.profile.hardware if simulation is not None else None


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _times(value: float) -> str:
    return f"{value:g}x"


def time_scale_of(campaign: Campaign, *, mode: str, peak_rate: float | None) -> TimeScale | None:
    """None at time_scale 1 (or an engine not simulated); else what the scale means for the modelled GPU, with the
    run's highest offered rate and the slo's deadlines converted (`peak_rate` None: a closed-loop run)."""
    scaled = kind_of(campaign.engine).time_scale(campaign.engine)
    if scaled is None or scaled[0] == 1.0:
        return None
    scale, profile = scaled
    hardware = _hardware(campaign)
    gpu = f"the modelled {hardware}" if hardware else f"profile {profile}'s hardware"
    speed = "half" if scale == 2.0 else f"{1 / scale:.3g}x its"
    said = [
        f"time_scale {scale:g}: every engine step takes {_times(scale)} the profile's time ({profile}), so "
        f"this run is {gpu} at {speed} speed: its latencies are {_times(scale)} that GPU's (divide them by "
        f"{scale:g})"
    ]
    if peak_rate is not None and peak_rate > 0:
        said.append(f"{peak_rate:.3g} req/s here is ~{peak_rate * scale:.3g} req/s on {gpu}")
    slo = campaign.slo
    deadlines = [(name, s) for name, s in (("TPOT", slo.tpot_s), ("TTFT", slo.ttft_s), ("E2E", slo.e2e_s))
                 if s is not None]  # fmt: skip
    if deadlines:
        here = _listed([f"{name} {s * 1e3:.4g} ms" for name, s in deadlines])
        there = _listed([f"{s / scale * 1e3:.4g} ms" for _, s in deadlines])
        verb = "are" if len(deadlines) > 1 else "is"
        also = " (per-category ones alike)" if slo.per_category else ""
        said.append(f"the slo's deadlines are wall seconds: {here} here {verb} {there} on that GPU{also}")
    if mode == "real":
        said.append("in real time the host's own delays (HTTP, Ray) are not slowed, only the engine's steps")
    return TimeScale(scale=scale, profile=profile, hardware=hardware, line="; ".join(said))
