"""A simulated arm's acceptance under vLLM's synthetic rejection sampling: the arm's rates replace the profile's.

vLLM's synthetic sampler accepts draft position i with the conditional rate c_i = p_i / p_(i-1) of the arm's
unconditional rates p (v1/sample/rejection_sampler.py 0.32:83-96, v1/spec_decode/utils.py 0.32:848-851), whatever
the drafter and target propose; so the profile's per-category acceptance is replaced by those conditional rates,
for every category alike. Whether the drafter proposes at all (draft_availability: n-gram finds no match) is the
drafter's, not the sampler's, and stays the profile's. Costs are untouched: that is the point of the knob.
"""

from __future__ import annotations

from typing import Any

from serve_apps.sim.profile import CategoryAcceptance, Profile
from serve_apps.spec_knobs import conditional_rates, synthetic_rates


def arm_profile(profile: Profile, policy: Any) -> Profile:
    """The profile an arm's simulated engine runs: the profile itself unless the policy samples synthetically."""
    if getattr(policy, "rejection_sample_method", "standard") != "synthetic":
        return profile
    rates = synthetic_rates(policy.synthetic_acceptance_rates, policy.synthetic_acceptance_length, policy.draft_window)
    per_position = conditional_rates(rates)
    acceptance = {
        category: CategoryAcceptance(per_position=per_position, draft_availability=a.draft_availability)
        for category, a in profile.acceptance.items()
    }
    return profile.model_copy(update={"acceptance": acceptance})
