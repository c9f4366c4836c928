"""The warning that a real engine is sent specdrill's generated template text, not anyone's traffic.

A drafter's acceptance depends on the text it drafts for: template prompts (loadshapes/prompts.py: nouns, names,
a few code lines, filled to a length) accept differently from real conversations, so on a real engine acceptance,
every speedup and every verdict measure the template. Said in the run's first lines, the report's notes and
summary.json's headline; a simulated engine is silent (its acceptance is the profile's, whatever the text), and so
is a mix of data sets (their text is real).
"""

from __future__ import annotations

from collections.abc import Mapping

from loadshapes.mixes import RequestMix
from loadshapes.shapes import Shape
from serve_apps.arms import EngineConfig
from serve_apps.engine_kinds.registry import kind_of

# Every line this module writes starts so: the console's report picks it out of summary.json's headline by it.
GENERATED_MARK = "generated text sent to a real engine:"


def generated_text_lines(engine: EngineConfig, mix: RequestMix, shapes: Mapping[str, Shape]) -> list[str]:
    """One line where a real engine (vllm, an endpoint, ...) gets template text: the mix's workloads (built-in or
    inline entries), or a replay shape (a trace records lengths, not text); none otherwise. Said once, when the
    run starts (the manifest's `generated_text`, which summary.json and the report read back)."""
    if kind_of(engine).simulation(engine) is not None:
        return []
    sources = []
    if mix.entries:
        names = sorted({e.resolved().name for e in mix.entries})
        sources.append(f"the mix's workloads ({', '.join(names)})")
    replays = sorted(name for name, shape in shapes.items() if shape.kind == "replay")
    if replays:
        sources.append(f"the replayed shapes ({', '.join(replays)}: a trace records lengths, not text)")
    if not sources:
        return []
    return [
        f"{GENERATED_MARK} {' and '.join(sources)} send specdrill's template prompts, not your traffic, so the "
        "drafter's acceptance, and every speedup and verdict here, measure the template; name a data set or your "
        "request logs as the mix (mix: {dataset: ...}) to measure your traffic"
    ]
