"""The schedule `specdrill recommend` would give each run (orchestrator/decide/recommend/build.py, from its summary's k
choices), and whether it changed: said only where both runs support one (a schedule, or leave speculation off)."""

from __future__ import annotations

from orchestrator.analysis.summary import Summary
from orchestrator.decide.recommend.build import recommend
from orchestrator.decide.recommend.recommendation import Recommendation
from orchestrator.decide.recommend.runs import RecommendError
from orchestrator.plan.campaign import Campaign

SUPPORTED = ("schedule", "off")


def _recommended(summary: Summary, campaign: Campaign, run_dir: str) -> Recommendation | str:
    try:
        return recommend(summary, campaign, run_dir)[0]
    except RecommendError as exc:  # no speculative arm, or no `off` arm: nothing to recommend from
        return str(exc)


def _said(found: Recommendation | str) -> str:
    if isinstance(found, str):
        return f"no recommendation ({found})"
    if found.status == "schedule":
        return f"num_speculative_tokens_per_batch_size {found.schedule}"
    if found.status == "off":
        return "leave speculation off"
    return "insufficient data for a recommendation"


def schedule_lines(baseline: tuple[Summary, Campaign, str], candidate: tuple[Summary, Campaign, str]) -> list[str]:
    """compare.json's `recommended`: each run's, then whether it changed where both support one."""
    before, after = _recommended(*baseline), _recommended(*candidate)
    lines = [f"baseline: {_said(before)}", f"candidate: {_said(after)}"]
    both = all(not isinstance(r, str) and r.status in SUPPORTED for r in (before, after))
    if not both:
        return [*lines, "not compared: a run supports no recommendation"]
    assert not isinstance(before, str) and not isinstance(after, str)
    changed = (before.status, before.schedule) != (after.status, after.schedule)
    return [*lines, "the recommended schedule changed" if changed else "the recommended schedule is the same"]
