"""Settings that are valid but cannot mean what they say: accepted, with one warning line each.

An SLO deadline below what the simulated engine's fastest possible step allows makes goodput 0 in every cell, so
every goodput figure (and a verdict that rests on one) would compare zeros. The bounds are lower bounds, with every
draft accepted and nothing else in the batch, so a warning is only given where no request can meet the deadline.
"""

from __future__ import annotations

from loadshapes.slo import Deadlines, SloConfig
from orchestrator.plan.size import fastest_step_s
from serve_apps.sim.profile import Profile


def step_s(profile: Profile, k: int) -> float:
    """The step of one request, one KV token, k drafted: the least a step with k draft tokens costs."""
    v = profile.verify
    verify = v.per_kv_token + v.per_batched_token * (1 + k) + v.fixed
    if k == 0:
        return verify + profile.step_overhead
    d = profile.draft
    draft = d.fraction * verify if d.kind == "fraction_of_verify" else d.per_kv_token + d.per_draft_token * k + d.fixed
    return verify + draft + profile.step_overhead


def fastest_token_s(profile: Profile, max_k: int) -> tuple[float, int]:
    """(seconds, k): the least time per output token, every draft accepted (k + 1 tokens a step)."""
    return min((step_s(profile, k) / (k + 1), k) for k in range(max_k + 1))


def slo_warnings(slo: SloConfig, profile: Profile, max_k: int) -> list[str]:
    first = fastest_step_s(profile)
    token, best_k = fastest_token_s(profile, max_k)
    named: list[tuple[str, Deadlines]] = [("slo", slo.for_category(None))]
    named += [(f"slo.per_category.{c}", slo.for_category(c)) for c in sorted(slo.per_category)]
    lines: list[str] = []
    seen: set[tuple[str, float]] = set()
    for where, deadlines in named:
        for field, bound, why in (
            ("ttft_s", first, f"its fastest step (one token, nothing drafted) takes {first * 1e3:.3g} ms"),
            ("e2e_s", first, f"its fastest step (one token, nothing drafted) takes {first * 1e3:.3g} ms"),
            ("tpot_s", token, f"a token takes at least {token * 1e3:.3g} ms (k = {best_k}, every draft accepted)"),
        ):
            value = getattr(deadlines, field)
            if value is None or value >= bound or (field, value) in seen:
                continue
            seen.add((field, value))
            lines.append(f"{where}.{field} = {value:g} s: no request can meet it on profile {profile.name!r}: {why}; "
                         "goodput will be 0 in every cell")  # fmt: skip
    return lines
