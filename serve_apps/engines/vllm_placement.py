"""What vLLM must be told about an arm's layout (serve_apps/placement.py): its backends, and on a spanning
layout the placement group it runs in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from serve_apps.placement import PlacedArm, plan_placement


def ray_dp_local_ranks(dp: int, tp: int) -> int:
    """DP ranks vLLM may put on the replica's own node (its DP master): as many as the node's free GPUs hold.
    vLLM's VLLM_RAY_DP_PACK_STRATEGY=fill gives the master exactly data_parallel_size_local ranks and every other
    node all it can hold; a fixed 0 would leave the GPUs of a replica placed on a GPU node unused, a fixed
    count would fail on a GPU-less node. The same private Ray figure vLLM reads (create_dp_placement_groups),
    read just before the engine is built from it."""
    import ray
    from ray._private.state import available_resources_per_node

    free = available_resources_per_node().get(ray.get_runtime_context().get_node_id(), {}).get("GPU", 0.0)  # type: ignore[no-untyped-call]
    return min(dp, int(free + 1e-9) // tp)


def placement_engine_args(
    arm: PlacedArm, local_ranks: Callable[[int, int], int] = ray_dp_local_ranks
) -> dict[str, Any]:
    """AsyncEngineArgs fields the layout decides: vLLM's executor and data-parallel backends (and on ray_dp the
    ranks on the replica's node, which only the replica can tell)."""
    plan = plan_placement(arm)
    args: dict[str, Any] = {}
    if plan.executor_backend is not None:
        args["distributed_executor_backend"] = plan.executor_backend
    if plan.data_parallel_backend is not None:
        args["data_parallel_backend"] = plan.data_parallel_backend
    if plan.layout == "ray_dp":
        args["data_parallel_size_local"] = local_ranks(arm.topology.data_parallel_size, plan.tensor_parallel_size)
    return args


def attach_placement_group(vllm_config: Any, arm: PlacedArm) -> None:
    """On a spanning layout, hand vLLM the replica's placement group explicitly (as Ray Serve LLM does): its Ray
    executor (RayExecutorV2) puts its ranks on that group's GPU bundles, driver node first."""
    if plan_placement(arm).layout != "spanning":
        return
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    if group is None:
        raise RuntimeError(f"arm {arm.name}: spanning layout but the replica runs outside a placement group")
    vllm_config.parallel_config.placement_group = group
