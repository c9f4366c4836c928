"""What a vLLM arm will run on a given vLLM, said before it runs: its model runner and executor, a refusal, a
dropped schedule and the drop's cause (the rules are serve_apps/vllm_versions.py's). Used where the vLLM is
known: the replica's placement probe (`specdrill deploy --check`), campaign validation (the vLLM installed
here), the verifier (the vLLM the run's replicas reported)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serve_apps.spec_knobs import knob_refusal
from serve_apps.vllm_versions import SUPPORTED, VllmTarget, minor_text, model_runner, predicted_executor, refusal


def expectation(policy: Any, topology: Any, target: VllmTarget, executor_backend: str | None = None) -> dict[str, Any]:
    """vllm, model_runner, executor (from the layout's executor_backend, serve_apps/placement.py; None: vLLM's
    default), refused (one line or None), schedule_dropped (the predicted cause, one line, or None)."""
    method = getattr(policy, "method", None)
    resolved = policy.resolve(topology, target)
    workers = topology.tensor_parallel_size * topology.data_parallel_size
    return {
        "vllm": target.version,
        "model_runner": model_runner(target, method),
        "executor": predicted_executor(target, executor_backend, workers),
        "refused": refusal(target, method) or knob_refusal(target, policy),
        "schedule_dropped": resolved.dropped_reason if resolved.schedule_dropped else None,
    }


def validation_lines(arms: Any, env: Mapping[str, str], installed: VllmTarget | None) -> list[str]:
    """One line per arm that a vLLM refuses, or whose schedule it drops for a reason other than its own topology:
    on the vLLM installed here, or (none here) on each supported minor's GPU build, naming it."""
    targets = [installed] if installed is not None else [VllmTarget(f"{minor_text(m)}.0", env) for m in SUPPORTED]
    where = "installed here" if installed is not None else "if the cluster runs it"
    lines: list[str] = []
    for arm in arms:
        if getattr(arm.policy, "method", None) is None:
            continue
        for target in targets:
            expected = expectation(arm.policy, arm.topology, target)
            said = f"arm {arm.name}: vLLM {target.version} ({where})"
            if expected["refused"]:
                lines.append(f"{said} refuses it: {expected['refused']}")
            elif expected["schedule_dropped"] and arm.topology.data_parallel_size == 1:
                lines.append(f"{said} drops its schedule: {expected['schedule_dropped']}")
    return lines
