"""The few lines an operator reads first (summary.json's headline): crossovers, findings that did not pass,
and the differences between the arms' engines beyond k."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.analysis.opmap.results import OperatingMap, VerificationReport
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.verify.findings import ran_instead

ABSOLUTE_ONLY = "no off arm: absolute figures only (analysis.absolute_only), no speedups"
EXEMPT_MARK = " (exempt)"  # after an exempt arm's name wherever its failure is printed


def headline(
    maps: list[OperatingMap], verification: VerificationReport, arms: list[ArmInfo], *, exempt: Sequence[str] = ()
) -> list[str]:
    """The few lines an operator reads first: crossovers, then every verification finding that did not pass
    (an exempt arm's failures marked so)."""
    lines: list[str] = []
    instead = {a.arm: said for a in verification.arms if (said := ran_instead(a)) is not None}
    for operating_map in maps:
        for crossover in operating_map.crossovers:
            # A verdict on an arm that ran something else than its policy is a verdict on what ran: said with it
            said = instead.get(crossover.arm)
            marked = f"; {crossover.arm} did not run as configured: {said}" if said else ""
            lines.append(f"[{operating_map.measure}] {crossover.message}{marked}")
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
    """What the arms' telemetry reveals about their engines beyond k: first a warning per arm whose max_model_len
    vLLM lowered (with vLLM's reason), then one line per fact the arms differ in: vLLM version, CUDA graph mode,
    model runner, executor, async scheduling, max_model_len (arms that do not report one are left out)."""
    arms: dict[str, dict[str, Any]] = manifest.get("arms", {})
    return [
        *max_model_len_lowered(arms),
        *(
            line
            for line in (
                _differs(arms, "vllm_version", "vLLM versions differ", str, "the vLLM version"),
                graph_mode_confound(arms),
                _differs(arms, "model_runner", "model runners differ", str, "the model runner"),
                _differs(arms, "executor", "executors differ", str, "the executor"),
                _differs(arms, "async_scheduling", "async scheduling differs", _on_off, "the scheduling"),
                _differs(arms, "max_model_len", "max_model_len differs", str, "the context limit"),
            )
            if line is not None
        ),
    ]


def _on_off(value: Any) -> str:
    return "on" if value else "off"


def max_model_len_lowered(arms: dict[str, dict[str, Any]]) -> list[str]:
    """A warning per arm whose engine runs a shorter max_model_len than it was given (vLLM 0.33+ lowers the
    target's to the drafter's on model runner V2): longer requests are refused or cut there, not by k."""
    lines = []
    for name, entry in sorted(arms.items()):
        reason = entry.get("max_model_len_lowered_reason")
        if reason:
            asked = entry.get("max_model_len_requested")
            was = f"from {asked} " if asked is not None else ""
            lines.append(f"arm {name}: vLLM lowered max_model_len {was}to {entry.get('max_model_len')}: {reason}")
    return lines


def engine_facts_text(entry: dict[str, Any]) -> str | None:
    """An arm's engine facts in one cell: vLLM version, model runner, executor, async scheduling, max_model_len
    (None: an arm that reports none, such as a simulated one)."""
    parts = [
        f"vLLM {entry['vllm_version']}" if entry.get("vllm_version") else None,
        entry.get("model_runner"),
        f"executor {entry['executor']}" if entry.get("executor") else None,
        None if entry.get("async_scheduling") is None else f"async {_on_off(entry['async_scheduling'])}",
        f"max_model_len {entry['max_model_len']}" if entry.get("max_model_len") is not None else None,
    ]
    said = [str(p) for p in parts if p]
    if said and entry.get("max_model_len_lowered_reason"):
        asked = entry.get("max_model_len_requested")
        said[-1] += f" (lowered from {asked})" if asked is not None else " (lowered)"
    return ", ".join(said) or None


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
