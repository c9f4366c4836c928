"""Where an arm's engines run in the Ray cluster: what each Serve replica holds, and how vLLM finds its devices.

Two layouts carry GPUs, chosen the way vLLM 0.32 and Ray Serve LLM expect them (see docs/engineering/gpu-review.md):

- `replica`: the engine fits on one node. The replica itself holds every GPU of its engine (dp x tp workers for a
  vLLM data-parallel group), no placement group, and vLLM's multiprocessing backends start the ranks and workers
  as child processes. vLLM maps DP rank r, TP rank t to CUDA_VISIBLE_DEVICES[r * tp + t] of the replica.
- `spanning`: tensor parallelism larger than a node (Ray Serve LLM's recipe). The replica holds no GPU; its CPUs
  are merged into the first bundle of a placement group of one-GPU bundles, which the engine passes to vLLM
  explicitly; vLLM's RayExecutorV2 orders the GPU bundles driver node first and places rank r on the r-th.
- `ray_dp`: a vLLM data-parallel group larger than a node, each rank within one node: vLLM's own Ray DP backend
  in internal load-balancing mode (data_parallel_backend=ray; v1/engine/utils.py CoreEngineActorManager). The
  replica holds no GPU and runs the front end; vLLM makes one STRICT_PACK placement group per rank (tp one-GPU
  bundles and a one-CPU bundle for the rank's EngineCoreActor, all on one node). VLLM_RAY_DP_PACK_STRATEGY=fill
  and data_parallel_size_local = the ranks the replica's own node can hold (0 on a GPU-less head, decided in the
  replica: serve_apps/engines/vllm_placement.py): every node takes as many ranks as its free GPUs hold.

A layout vLLM cannot run is refused here, before anything deploys.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

from serve_apps.engine_kinds.base import EngineConfigBase
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.policies import Topology
from serve_apps.resources import Resources


class PlacedArm(Protocol):
    """What placement reads of an arm (serve_apps.arms.ArmSpec, which validates its layout here: named by shape,
    so that placement does not import arms)."""

    @property
    def name(self) -> str: ...
    @property
    def topology(self) -> Topology: ...
    @property
    def resources(self) -> Resources: ...
    @property
    def engine(self) -> EngineConfigBase: ...


class PlacementError(ValueError):
    pass


class ArmPlacement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    layout: Literal["cpu", "replica", "spanning", "ray_dp"]
    replicas: int
    workers_per_replica: int  # GPU workers of one replica's engine: tp, or dp x tp for a vLLM DP group
    replica_cpus: float
    replica_gpus: float
    bundles: tuple[dict[str, float], ...] | None  # the placement group of one replica (spanning only)
    strategy: str | None
    max_replicas_per_node: int | None
    # vLLM's distributed_executor_backend and data_parallel_backend for this layout (None: vLLM's default)
    executor_backend: Literal["mp", "ray"] | None
    data_parallel_backend: Literal["mp", "ray"] | None
    tensor_parallel_size: int = 1
    engine_env: dict[str, str] = {}  # environment of the replica that the layout needs vLLM to read

    @property
    def total_gpus(self) -> float:
        return self.replicas * self.workers_per_replica * self._gpus_per_worker

    @property
    def _gpus_per_worker(self) -> float:
        if self.layout == "ray_dp":
            return 1.0
        if self.bundles:
            return self.bundles[-1].get("GPU", 0.0)
        return self.replica_gpus / self.workers_per_replica

    def replica_demand(self) -> list[dict[str, float]]:
        """What one replica needs from the cluster, as the bundles Ray must place on one node each (one bundle
        when no group; on ray_dp the replica and then each DP rank's group, as vLLM makes it)."""
        if self.bundles is not None:
            return [dict(b) for b in self.bundles]
        demand = {"CPU": self.replica_cpus}
        if self.replica_gpus:
            demand["GPU"] = self.replica_gpus
        if self.layout == "ray_dp":
            ranks = self.workers_per_replica // self.tensor_parallel_size
            rank = {"CPU": 1.0, "GPU": float(self.tensor_parallel_size)}  # vLLM's STRICT_PACK group of one rank
            return [demand] + [dict(rank) for _ in range(ranks)]
        return [demand]


def plan_placement(arm: PlacedArm) -> ArmPlacement:
    """The layout of an arm, from its topology, engine and resources. Pure: the same arm always gets the same
    layout, in the driver (to deploy it) and in the replica (to tell vLLM how to find its devices)."""
    topo = arm.topology
    res = arm.resources
    kind = kind_of(arm.engine)
    spawns = kind.spawns_workers  # the engine starts its own DP ranks and TP workers (vLLM)
    tp = topo.tensor_parallel_size
    vllm_dp = topo.data_parallel_size if spawns else 1
    # A simulated DP rank is its own replica; a vLLM DP group is one replica whose engine starts every rank.
    replicas = 1 if topo.kind == "single" or (spawns and topo.kind == "data_parallel") else topo.size
    workers = tp * vllm_dp
    gpu = res.gpus_per_engine
    name = f"arm {arm.name}"
    if gpu == 0:
        return ArmPlacement(
            layout="cpu", replicas=replicas, workers_per_replica=workers, replica_cpus=res.cpus_per_engine,
            replica_gpus=0.0, bundles=None, strategy=None, max_replicas_per_node=res.max_engines_per_node,
            executor_backend="mp" if spawns and tp > 1 else None,
            data_parallel_backend="mp" if vllm_dp > 1 else None,
        )  # fmt: skip
    if workers > 1 and gpu != 1:
        raise PlacementError(
            f"{name}: each of its {workers} GPU workers (tensor_parallel_size {tp}"
            f"{f' x data_parallel {vllm_dp}' if vllm_dp > 1 else ''}) uses one whole GPU; "
            f"resources.gpus_per_engine must be 1, got {gpu:g}"
        )
    share = kind.gpu_memory_share(arm.engine)
    if share is not None and gpu < 1:
        _refuse_oversubscribed_gpu(arm, gpu, share)
    node = res.gpus_per_node
    if node is None or workers * gpu <= node:
        return ArmPlacement(
            layout="replica", replicas=replicas, workers_per_replica=workers, replica_cpus=res.cpus_per_engine,
            replica_gpus=workers * gpu, bundles=None, strategy=None, max_replicas_per_node=res.max_engines_per_node,
            # Explicit: inside a placement group vLLM would default to its Ray executor.
            executor_backend="mp" if spawns and tp > 1 else None,
            data_parallel_backend="mp" if vllm_dp > 1 else None,
        )  # fmt: skip
    if vllm_dp > 1:
        return _ray_data_parallel(arm, vllm_dp, tp, node)
    if res.max_engines_per_node is not None:
        raise PlacementError(
            f"{name}: resources.max_engines_per_node cannot apply to an engine spanning nodes (tensor_parallel_size "
            f"{tp} > {node} GPUs per node); use resources.placement_strategy"
        )
    bundles = [{"CPU": res.cpus_per_engine, "GPU": gpu}] + [{"GPU": gpu} for _ in range(tp - 1)]
    return ArmPlacement(
        layout="spanning", replicas=replicas, workers_per_replica=workers, replica_cpus=res.cpus_per_engine,
        replica_gpus=0.0, bundles=tuple(bundles), strategy=res.placement_strategy, max_replicas_per_node=None,
        executor_backend="ray" if spawns else None, data_parallel_backend=None,
    )  # fmt: skip


# vLLM reads these when it makes the DP ranks' placement groups (vllm/envs.py, v1/engine/utils.py)
RAY_DP_ENV = {"VLLM_RAY_DP_PACK_STRATEGY": "fill"}


def _ray_data_parallel(arm: PlacedArm, dp: int, tp: int, node: int) -> ArmPlacement:
    res = arm.resources
    name = f"arm {arm.name}"
    if tp > node:
        # vLLM's "span" packing (a rank over several nodes) needs homogeneous nodes and data_parallel_size_local
        # 1 on every node (create_dp_placement_groups): not a layout specdrill places.
        raise PlacementError(
            f"{name}: data_parallel {dp} x tensor_parallel_size {tp}: one DP rank needs {tp} GPUs, the nodes have "
            f"{node}; specdrill runs vLLM's Ray DP backend with each rank on one node (tensor_parallel_size <= "
            "gpus_per_node); for a larger engine use tensor parallelism alone (the spanning layout)"
        )
    if res.max_engines_per_node is not None:
        raise PlacementError(
            f"{name}: resources.max_engines_per_node cannot apply to a data-parallel group spanning nodes (vLLM "
            "places its ranks itself, as many per node as its free GPUs hold)"
        )
    return ArmPlacement(
        layout="ray_dp", replicas=1, workers_per_replica=dp * tp, replica_cpus=res.cpus_per_engine,
        replica_gpus=0.0, bundles=None, strategy=None, max_replicas_per_node=None,
        # The rank's EngineCoreActor holds only its CPU bundle: its workers take the GPU bundles through vLLM's
        # Ray executor (vLLM selects it for data_parallel_backend=ray, config/parallel.py), tp 1 included.
        executor_backend="ray", data_parallel_backend="ray", tensor_parallel_size=tp,
        engine_env=dict(RAY_DP_ENV),
    )  # fmt: skip


def _refuse_oversubscribed_gpu(arm: PlacedArm, gpu: float, memory_share: tuple[float, str]) -> None:
    """A fractional GPU lets Ray put floor(1 / gpus_per_engine) engines on one GPU (of this arm or another of the
    campaign: they share the engine config); vLLM sizes each engine's memory as gpu_memory_utilization of the
    whole GPU, so together they must fit in it, or the later ones fail to start for want of memory."""
    share, where = memory_share
    per_gpu = math.floor(1 / gpu + 1e-9)
    if per_gpu * float(share) > 1 + 1e-9:
        raise PlacementError(
            f"arm {arm.name}: resources.gpus_per_engine {gpu:g} puts up to {per_gpu} engines on one GPU, each "
            f"taking gpu_memory_utilization {float(share):g} ({where}) of its memory: {per_gpu * float(share):g} "
            f"> 1; set engine_kwargs.gpu_memory_utilization to at most {math.floor(100 / per_gpu) / 100:g}"
        )
