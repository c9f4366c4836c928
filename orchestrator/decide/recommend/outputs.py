"""`specdrill recommend`'s files and words: recommendation.json and the rehearsal and follow-up campaigns written
into the first run's directory, and what the command prints about them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from orchestrator.decide.recommend.build import data_parallel_snippet, vllm_snippet
from orchestrator.decide.recommend.campaigns import files_gone
from orchestrator.decide.recommend.deployment import deployment_words
from orchestrator.decide.recommend.recommendation import Recommendation
from orchestrator.decide.recommend.runs import RunEvidence
from orchestrator.rundir.layout import RunStore
from serve_apps.engine_kinds.registry import kind_of

RECOMMENDATION = "recommendation.json"
REHEARSAL = "recommended-campaign.yaml"
FOLLOWUP = "followup-campaign.yaml"


def write_recommendation(
    runs: Sequence[RunEvidence],
    recommendation: Recommendation,
    rehearsal: dict[str, Any] | None,
    followup: dict[str, Any] | None,
) -> str:
    """Write the files into the first run's directory (an earlier recommendation's campaign that this one has not is
    removed) and return the text the command prints: the recommendation, vLLM's config, the commands that go on."""
    first = runs[0]
    store = RunStore(first.run_dir, create=False)
    store.write_json(RECOMMENDATION, recommendation.model_dump(mode="json"))
    # The run's mode decides the command: a virtual-time run rehearses in virtual time
    command = "specdrill simulate" if first.mode == "virtual" else "specdrill run"
    for name, campaign in {REHEARSAL: rehearsal, FOLLOWUP: followup}.items():
        if campaign is not None:
            store.write_text(name, yaml.safe_dump(campaign, sort_keys=False))
        elif store.exists(name):
            store.remove(name)  # an earlier recommendation's: not this one's
    lines = [recommendation.message]
    snippet = vllm_snippet(recommendation) + data_parallel_snippet(recommendation)
    if rehearsal is not None:
        lines.append(recommendation.frame)
        what = deployment_words(runs, recommendation)
        lines.append(f"rehearse it{f' ({what})' if what else ''}: {command} {store.root}/{REHEARSAL}")
        if kind_of(first.campaign.engine).runs_in_virtual_time:  # tune rehearses in virtual time
            lines.append(f"a schedule in its own frame: specdrill tune {store.root}/{REHEARSAL}")
        else:
            lines.append(
                f"a schedule in its own frame: specdrill calibrate {store.root} -o profile.yaml, then specdrill tune "
                "on a simulated-engine copy of the campaign with --profile profile.yaml"
            )
    else:
        lines.append("nothing to rehearse: no schedule is recommended")
    for name, campaign in {REHEARSAL: rehearsal, FOLLOWUP: followup}.items():
        for path in files_gone(campaign) if campaign is not None else []:
            # the run's own file, moved or on another machine: the campaign would be refused when run
            lines.append(f"{name} names {path}, which is not here: point it at the file before running it")
    if followup is not None:
        beside = " beside the current best" if recommendation.status != "insufficient" else ""
        lines.append(f"measure what is missing{beside}: {command} {store.root}/{FOLLOWUP}")
        lines.append(f"then: specdrill recommend {' '.join(r.run_dir for r in runs)} {followup['output']}")
    # vLLM's snippet ends its own lines (or is empty): it goes between the message and the rest, as it is
    return lines[0] + "\n" + snippet + "".join(line + "\n" for line in lines[1:])
