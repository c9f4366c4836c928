"""What vLLM must be told about an arm's layout (serve_apps/placement.py): its backends, and on a spanning
layout the placement group it runs in."""

from __future__ import annotations

from typing import Any

from serve_apps.arms import ArmSpec
from serve_apps.placement import plan_placement


def placement_engine_args(arm: ArmSpec) -> dict[str, Any]:
    """AsyncEngineArgs fields the layout decides: vLLM's executor and data-parallel backends."""
    plan = plan_placement(arm)
    args: dict[str, Any] = {}
    if plan.executor_backend is not None:
        args["distributed_executor_backend"] = plan.executor_backend
    if plan.data_parallel_backend is not None:
        args["data_parallel_backend"] = plan.data_parallel_backend
    return args


def attach_placement_group(vllm_config: Any, arm: ArmSpec) -> None:
    """On a spanning layout, hand vLLM the replica's placement group explicitly (as Ray Serve LLM does): its Ray
    executor puts worker i on the i-th GPU bundle of that group."""
    if plan_placement(arm).layout != "spanning":
        return
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    if group is None:
        raise RuntimeError(f"arm {arm.name}: spanning layout but the replica runs outside a placement group")
    vllm_config.parallel_config.placement_group = group
