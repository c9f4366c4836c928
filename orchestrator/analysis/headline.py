"""The few lines an operator reads first (summary.json's headline): crossovers, findings that did not pass,
and the differences between the arms' engines beyond k."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.analysis import ArmInfo, OperatingMap, VerificationReport

ABSOLUTE_ONLY = "no off arm: absolute figures only (analysis.absolute_only), no speedups"
EXEMPT_MARK = " (exempt)"  # after an exempt arm's name wherever its failure is printed


def headline(
    maps: list[OperatingMap], verification: VerificationReport, arms: list[ArmInfo], *, exempt: Sequence[str] = ()
) -> list[str]:
    """The few lines an operator reads first: crossovers, then every verification finding that did not pass
    (an exempt arm's failures marked so)."""
    lines: list[str] = []
    for operating_map in maps:
        for crossover in operating_map.crossovers:
            lines.append(f"[{operating_map.measure}] {crossover.message}")
    for checked in verification.arms:
        lines.extend(
            f.message + (EXEMPT_MARK if f.failed and checked.arm in exempt else "")
            for f in checked.findings
            if not f.passed
        )
    lines.extend(
        t.message + (EXEMPT_MARK if t.status == "fail" and t.arm in exempt else "") for t in verification.switch_timings
    )
    return lines


def engine_confounds(manifest: dict[str, Any]) -> list[str]:
    """Differences between the arms' engines, beyond k, that their telemetry reveals: CUDA graph mode, model
    runner, async scheduling. One line each where the arms differ (arms that do not report one are left out)."""
    arms: dict[str, dict[str, Any]] = manifest.get("arms", {})
    return [
        line
        for line in (
            graph_mode_confound(arms),
            _differs(arms, "model_runner", "model runners differ", str, "the model runner"),
            _differs(
                arms, "async_scheduling", "async scheduling differs", lambda v: "on" if v else "off", "the scheduling"
            ),
        )
        if line is not None
    ]


def graph_mode_confound(arms: dict[str, dict[str, Any]]) -> str | None:
    """Where the arms' CUDA graph modes differ, part of any difference between them is the graph mode, not k.
    The cause is named only where the arm's facts make it true: vLLM's model runner V1 forces PIECEWISE graphs
    for a dynamic schedule (vllm/config/vllm.py, _maybe_override_dynamic_sd_cudagraph_mode); model runner V2
    keeps full graphs for it, so there the modes agree and nothing is said."""
    line = _differs(arms, "cudagraph_mode", "CUDA graph modes differ", str, "the graph mode")
    if line is None:
        return None
    forced = sorted(
        name
        for name, entry in arms.items()
        if entry.get("model_runner") == "V1"
        and entry.get("cudagraph_mode") == "PIECEWISE"
        and (entry.get("policy") or {}).get("kind") == "dynamic"
    )
    if forced:
        line += f" (model runner V1 forces PIECEWISE for a dynamic schedule: {', '.join(forced)})"
    return line


def _differs(arms: dict[str, dict[str, Any]], key: str, what: str, show: Callable[[Any], str], part: str) -> str | None:
    known = {name: show(entry[key]) for name, entry in arms.items() if entry.get(key) is not None}
    if len(set(known.values())) <= 1:
        return None
    listed = ", ".join(f"{name} {value}" for name, value in sorted(known.items()))
    return f"{what} between arms ({listed}): part of their difference is {part}, not k"
