"""The placement probe: runs in a replica in place of its engine (`specdrill deploy --check`) and proves, within
seconds and without loading a model, that every GPU worker of the engine gets a device.

- `replica` layout: the GPUs Ray gave the replica must be exactly the ones the engine needs, and vLLM's own
  helpers must map each DP rank and TP worker to a distinct one of them (the mapping vLLM's engine-core processes
  and GPU workers use; on a node whose GPUs are declared to Ray but not present, with CUDA's semantics).
- `spanning` layout: a one-GPU actor is placed on every bundle vLLM's Ray executor would use; a bundle whose GPU
  is held (e.g. by the replica itself) or cannot be placed fails the probe with Ray's view of it.
- `ray_dp` layout: vLLM's own CoreEngineActorManager.create_dp_placement_groups makes the ranks' placement groups
  from the cluster's free resources, as the engine would; a one-GPU actor is placed on every GPU bundle and a
  one-CPU actor on each rank's engine-core bundle, then the groups are removed.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from serve_apps.arms import ArmSpec
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.engines.base import GenerationInput, GenerationResult, TextDelta
from serve_apps.placement import ArmPlacement, plan_placement

CUDA_DEVICES = "CUDA_VISIBLE_DEVICES"  # vLLM's CudaPlatform.device_control_env_var
BUNDLE_TIMEOUT_S = 20.0


class PlacementProbeError(RuntimeError):
    pass


def _ray_dp_probe(arm: ArmSpec, plan: ArmPlacement) -> dict[str, Any]:
    import ray
    from ray.util import remove_placement_group
    from vllm.v1.engine import utils

    from serve_apps.engines.vllm_placement import ray_dp_local_ranks
    from serve_apps.placement import RAY_DP_ENV

    tp = plan.tensor_parallel_size
    dp = plan.workers_per_replica // tp
    wrong_env = {k: os.environ.get(k) for k, v in RAY_DP_ENV.items() if os.environ.get(k) != v}
    if wrong_env:
        raise PlacementProbeError(f"the replica's environment has {wrong_env}, the layout needs {RAY_DP_ENV}")
    master = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    # The fields of VllmConfig that create_dp_placement_groups reads, as the engine's config would hold them.
    local = ray_dp_local_ranks(dp, tp)
    parallel = SimpleNamespace(data_parallel_master_ip=master, data_parallel_size=dp, world_size=tp,
                               data_parallel_size_local=local,
                               all2all_backend="allgather_reducescatter")  # fmt: skip
    try:
        with cuda_platform_in(utils):  # where GPUs are only declared to Ray: CUDA's resource name is all it reads
            groups, local_ranks = utils.CoreEngineActorManager.create_dp_placement_groups(
                SimpleNamespace(parallel_config=parallel)  # type: ignore[arg-type]
            )
    except (ValueError, AssertionError) as exc:
        raise PlacementProbeError(f"vLLM could not place {dp} DP ranks of {tp} GPUs: {exc}") from None
    try:
        ranks = []
        for rank, (group, local_index) in enumerate(zip(groups, local_ranks, strict=True)):
            try:
                ray.get(group.ready(), timeout=BUNDLE_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise PlacementProbeError(
                    f"DP rank {rank}: its placement group was not placed within {BUNDLE_TIMEOUT_S:g} s"
                ) from None
            placed = _place_on(group, list(range(tp)), gpus=1.0)
            (engine_core,) = _place_on(group, [tp], gpus=0.0, cpus=1.0)  # the rank's EngineCoreActor bundle
            ranks.append({"dp_rank": rank, "local_dp_rank": local_index, "engine_core": engine_core, "workers": placed,
                          "nodes": sorted({p["node_id"] for p in placed})})  # fmt: skip
        return {"dp_master_ip": master, "data_parallel_size_local": local, "ranks": ranks}
    finally:
        for group in groups:
            remove_placement_group(group)


def _place_on(
    group: Any, indices: list[int], *, gpus: float, cpus: float = 0.0, hint: str = ""
) -> list[dict[str, Any]]:
    """An actor on each bundle of `group` at `indices`, asked where it runs; killed before returning."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0)
    class Dummy:
        def where(self) -> dict[str, Any]:
            context = ray.get_runtime_context()
            return {"node_id": context.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    actors = [
        Dummy.options(  # type: ignore[attr-defined]
            num_gpus=gpus, num_cpus=cpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group,
                                                                 placement_group_bundle_index=index),
        ).remote()
        for index in indices
    ]  # fmt: skip
    try:
        placed = []
        for index, actor in zip(indices, actors, strict=True):
            try:
                placed.append({"bundle": index, **ray.get(actor.where.remote(), timeout=BUNDLE_TIMEOUT_S)})
            except ray.exceptions.GetTimeoutError:
                raise PlacementProbeError(
                    f"bundle {index} of the placement group: a {gpus:g}-GPU actor was not placed within "
                    f"{BUNDLE_TIMEOUT_S:g} s {hint}".rstrip()
                ) from None
        return placed
    finally:
        for actor in actors:
            ray.kill(actor)


def _cuda_platform() -> Any:
    """vLLM's platform for device ids: the real one on a CUDA node; on a node whose GPUs are only declared to Ray
    (tests, `--check` from a CPU image) vLLM's generic Platform with CUDA's device variable, which is all that
    CudaPlatform's device-id methods use."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform

    if current_platform.is_cuda_alike():
        return current_platform

    class CudaDeviceIds(Platform):
        device_control_env_var = CUDA_DEVICES
        ray_device_key = "GPU"  # CudaPlatform's

    return CudaDeviceIds


@contextmanager
def cuda_platform_in(module: Any) -> Iterator[Any]:
    """vLLM's helpers read `current_platform` from their own module's globals: give them _cuda_platform() there
    while the block runs."""
    platform = _cuda_platform()
    saved = module.current_platform
    module.current_platform = platform
    try:
        yield platform
    finally:
        module.current_platform = saved


def vllm_device_map(dp: int, tp: int) -> list[dict[str, Any]]:
    """Physical device of every (DP rank, TP rank) worker, from vLLM's own helpers and visible-device variable."""
    from vllm.v1.engine import utils

    with cuda_platform_in(utils) as platform:  # get_physical_gpu_ids_for_local_dp_rank reads the module's global
        workers = []
        for rank in range(dp):
            try:
                rank_devices = utils.get_physical_gpu_ids_for_local_dp_rank(CUDA_DEVICES, rank, tp)
            except Exception as exc:  # vLLM raises a bare Exception ("Error computing device indices ...")
                raise PlacementProbeError(f"DP rank {rank}: {exc}") from None
            for tp_rank in range(tp):
                # GPU worker: local_rank = dp_local_rank * tp + tp_rank (vllm/v1/worker/gpu_worker.py)
                device = platform.device_id_to_physical_device_id(rank * tp + tp_rank)
                workers.append(
                    {"dp_rank": rank, "tp_rank": tp_rank, "device": int(device), "rank_devices": rank_devices}
                )
        return workers


def _probe_replica(arm: ArmSpec, plan: ArmPlacement) -> dict[str, Any]:
    import ray

    assigned = [str(g) for g in ray.get_gpu_ids()]
    visible = os.environ.get(CUDA_DEVICES, "")
    report: dict[str, Any] = {"replica_gpu_ids": assigned, "visible_devices": visible}
    if ray.util.get_current_placement_group() is not None and plan.executor_backend is None:
        raise PlacementProbeError("the replica runs inside a placement group: vLLM would pick its Ray executor")
    if kind_of(arm.engine).spawns_workers:
        # vLLM's own mapping first, so an engine short of devices fails with vLLM's message.
        workers = vllm_device_map(arm.topology.data_parallel_size, arm.topology.tensor_parallel_size)
        devices = [w["device"] for w in workers]
        if len(set(devices)) != len(devices):
            raise PlacementProbeError(f"GPU workers share devices: {workers}")
        outside = sorted({str(d) for d in devices} - set(visible.split(",")))
        if outside:
            raise PlacementProbeError(f"devices {', '.join(outside)} are not among the replica's ({visible})")
        report["workers"] = workers
    if len(assigned) != math.ceil(plan.replica_gpus):  # a fractional GPU still shows as one id
        raise PlacementProbeError(
            f"the replica holds {len(assigned)} GPUs ({','.join(assigned) or 'none'}), its engine needs "
            f"{plan.replica_gpus:g}"
        )
    return report


def _probe_bundles(plan: ArmPlacement) -> dict[str, Any]:
    import ray

    group = ray.util.get_current_placement_group()
    if group is None:
        raise PlacementProbeError("spanning layout but the replica runs outside a placement group")

    # The bundles vLLM's Ray executor uses, in its rank order: RayExecutorV2 (0.32's default) sorts the GPU
    # bundles driver node first (vllm/v1/executor/ray_utils.py get_bundles_sorted_by_node; its V1 executor took
    # them in index order).
    ordered = _v2_rank_order(group)[: plan.workers_per_replica]
    if len(ordered) < plan.workers_per_replica:
        raise PlacementProbeError(f"{len(ordered)} GPU bundles for {plan.workers_per_replica} workers")
    gpus = plan.bundles[-1]["GPU"] if plan.bundles else 1.0
    hint = "(its GPU is held, e.g. by the replica itself); vLLM's Ray worker on it would wait there forever"
    placed = _place_on(group, ordered, gpus=gpus, hint=hint)
    workers = v2_devices(placed)
    return {"bundles": workers, "nodes": sorted({p["node_id"] for p in workers})}


def _v2_rank_order(group: Any) -> list[int]:
    from vllm.v1.executor import ray_utils

    with cuda_platform_in(ray_utils):  # where GPUs are only declared to Ray: CUDA's resource name is all it reads
        return [index for index, _, _ in ray_utils.get_bundles_sorted_by_node(group)]


def v2_devices(placed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worker (rank) r on placed[r]: its local rank among the workers of its node, and the physical GPU it
    opens. RayExecutorV2 keeps Ray from setting CUDA_VISIBLE_DEVICES on its workers and maps local rank j of a
    node to the j-th smallest of the GPU ids Ray gave that node's workers (ray_executor_v2.py, steps 5-6), so a
    worker's device need not be the GPU of its own bundle, but the node's set is the engine's own."""
    by_node: dict[str, list[int]] = {}
    for rank, where in enumerate(placed):
        by_node.setdefault(where["node_id"], []).append(rank)
    ids = {node: sorted(int(g) for r in ranks for g in placed[r]["gpu_ids"]) for node, ranks in by_node.items()}
    workers = []
    for rank, where in enumerate(placed):
        local = by_node[where["node_id"]].index(rank)
        workers.append({**where, "worker": rank, "local_rank": local, "device": ids[where["node_id"]][local]})
    return workers


def probe(arm: ArmSpec) -> dict[str, Any]:
    """Blocking: run in a thread. Raises PlacementProbeError with the reason the engine could not get devices."""
    import ray

    plan = plan_placement(arm)
    report: dict[str, Any] = {
        "arm": arm.name,
        "layout": plan.layout,
        "node_id": ray.get_runtime_context().get_node_id(),
        "executor_backend": plan.executor_backend,
        "data_parallel_backend": plan.data_parallel_backend,
    }
    if plan.layout == "replica":
        report.update(_probe_replica(arm, plan))
    elif plan.layout == "spanning":
        report.update(_probe_bundles(plan))
    elif plan.layout == "ray_dp":
        report.update(_ray_dp_probe(arm, plan))
    if kind_of(arm.engine).spawns_workers:
        report["speculation"] = speculation_on_this_node(arm)
    report["ok"] = True
    return report


def speculation_on_this_node(arm: ArmSpec) -> dict[str, Any]:
    """What the arm's engine would run on the vLLM installed in this replica, with its environment (engine.env):
    the version, model runner, executor and predicted schedule drop; refused in one line as the engine itself
    would be."""
    from serve_apps.engines.vllm_support import installed_vllm, start_refusal
    from serve_apps.vllm_expect import expectation

    target = installed_vllm(dict(os.environ))
    if target is None:
        raise PlacementProbeError("no vLLM is installed in the replica (pip install 'specdrill[vllm]')")
    refused = start_refusal(target, getattr(arm.policy, "method", None), arm.policy)
    if refused:
        raise PlacementProbeError(refused)
    return expectation(arm.policy, arm.topology, target, plan_placement(arm).executor_backend)


class PlacementProbeEngine:
    """An engine that only proves placement: it answers /specdrill/placement and refuses generation."""

    kind = "placement-probe"

    def __init__(self, arm: ArmSpec, *, engine_id: str) -> None:
        self.arm = arm
        self.engine_id = engine_id
        self.report: dict[str, Any] | None = None

    async def start(self) -> None:
        if self.report is None:
            try:
                self.report = await asyncio.to_thread(probe, self.arm)
            except PlacementProbeError as exc:
                raise PlacementProbeError(f"placement probe of arm {self.arm.name}: {exc}") from None

    async def stop(self) -> None:
        return None

    async def check_health(self) -> None:
        return None  # nothing runs after the probe: the replica is healthy as long as its actor lives

    async def generate(self, request: GenerationInput) -> AsyncIterator[TextDelta | GenerationResult]:
        raise ValueError("this arm runs the placement probe (specdrill deploy --check): no engine to generate")
        yield  # pragma: no cover  (makes this an async generator)

    def resolved_speculative_config(self) -> dict[str, Any] | None:
        return None

    def timeline(self, since_step: int = 0) -> dict[str, list[float] | list[int]]:
        return {}

    def live(self) -> dict[str, float]:
        return {"running": 0.0, "waiting": 0.0, "k": 0.0}

    def versions(self) -> dict[str, str]:
        return {"engine": "specdrill-placement-probe"}
