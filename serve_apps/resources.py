"""What an arm reserves in the Ray cluster for each of its engines: part of the arm as the campaign writes it, read
by placement (serve_apps/placement.py) and by the engine kinds, so it sits below both."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Resources(BaseModel):
    """What each engine of the arm reserves in the Ray cluster (`specdrill deploy --check` shows where it lands)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus_per_engine: float = Field(default=0.5, gt=0, description="CPUs each engine's replica reserves")
    # GPUs per GPU worker: an engine of tensor_parallel_size T (x data_parallel N for vLLM) has T (x N) workers.
    gpus_per_engine: float = Field(default=0.0, ge=0)
    # GPUs on each GPU node. Decides whether an engine fits one node (the replica holds its GPUs) or spans nodes
    # (a placement group); read from the cluster at deploy time when not given.
    gpus_per_node: int | None = Field(default=None, ge=1)
    # The cluster adds nodes on demand (Ray autoscaler): do not refuse what the nodes up now cannot hold.
    autoscaling: bool = False
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        default="PACK", description="Ray placement strategy for engines that span nodes (a placement group)"
    )
    # At most this many of the arm's engines on one node (Serve's max_replicas_per_node): 1 spreads them out.
    max_engines_per_node: int | None = Field(default=None, ge=1)
