"""What `specdrill simulate oracle` computes the ground truth of: the profile, the workload and the largest k. With
`--campaign`, taken from the campaign as `tune` takes them (decide/tune.py: the mix's heaviest workload, the
speculative arms' largest k), so the oracle an operator runs is the one the decisions are graded against
(docs/engineering/grading.md); without, the defaults below, named in the command's output."""

from __future__ import annotations

from dataclasses import dataclass

from loadshapes.mixes import Workload
from orchestrator.cli.common import campaign_of, fail, profile_named, workload_named
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.sim.profile import Profile

DEFAULT_PROFILE = "llama3.1-8b-h100-eagle"
DEFAULT_WORKLOAD = "chat"  # the workload of a campaign without a mix (orchestrator.plan.campaign's default mix)
DEFAULT_MAX_K = 4


@dataclass(frozen=True)
class OracleSetup:
    profile: Profile
    workload: Workload
    max_k: int
    workload_from: str  # where the workload came from, in the words the command prints
    max_k_from: str


def oracle_setup(
    campaign_file: str | None, profile_name: str | None, workload_name: str | None, max_k: int | None
) -> OracleSetup:
    from orchestrator.decide.tune.build import drafter_of, oracle_workload

    campaign = campaign_of(campaign_file) if campaign_file else None
    if profile_name is None and campaign is not None:
        simulation = kind_of(campaign.engine).simulation(campaign.engine)
        if simulation is None:
            fail(f"--campaign {campaign_file}: engine kind {campaign.engine.kind} has no simulated profile: give "
                 "--profile")  # fmt: skip
            raise AssertionError  # fail exits
        profile = simulation.profile
    else:
        profile = profile_named(profile_name or DEFAULT_PROFILE)
    if workload_name is not None:
        workload, workload_from = workload_named(workload_name, profile), "--workload"
    elif campaign is not None:
        workload, workload_from = oracle_workload(campaign), "the campaign's heaviest mix entry"
        if profile.resolve_category(workload.category) is None:
            fail(f"--campaign {campaign_file}: profile {profile.name!r} has no acceptance for its workload's "
                 f"category {workload.category!r}")  # fmt: skip
    else:
        workload, workload_from = workload_named(DEFAULT_WORKLOAD, profile), "the default mix's"
    # A profile's limits.max_draft_tokens (a fitted one's: the longest draft measured) caps the default and
    # refuses a larger k asked for (decide/oracle.py refuses it too).
    limit = profile.limits.max_draft_tokens
    if max_k is not None:
        if limit is not None and max_k > limit:
            fail(f"--max-k {max_k}: above profile {profile.name}'s limits.max_draft_tokens {limit} (a fitted "
                 "profile's: the longest draft its acceptance was measured at)")  # fmt: skip
        return OracleSetup(profile, workload, max_k, workload_from, "--max-k")
    wanted, max_k_from = DEFAULT_MAX_K, "the default"
    if campaign is not None:
        wanted, max_k_from = drafter_of(campaign, profile)[2], "the campaign's largest"
    if limit is not None and wanted > limit:
        wanted, max_k_from = limit, f"profile {profile.name}'s limits.max_draft_tokens"
    return OracleSetup(profile, workload, wanted, workload_from, max_k_from)
