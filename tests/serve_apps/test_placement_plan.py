"""Arm layouts (serve_apps/placement.py) as pure decisions: what each replica holds, which backends vLLM gets,
and which layouts are refused before anything deploys."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from serve_apps.arms import ArmSpec
from serve_apps.placement import plan_placement


def _arm(topology: dict[str, Any], *, engine: str = "vllm", **resources: Any) -> ArmSpec:
    engine_config = {"kind": "vllm", "model": "m"} if engine == "vllm" else {"kind": "simulated"}
    return ArmSpec.model_validate(
        {
            "name": "a",
            "policy": {"kind": "off"},
            "topology": topology,
            "engine": engine_config,
            "resources": {"cpus_per_engine": 2, **resources},
        }
    )


@pytest.mark.parametrize(
    ("topology", "gpus", "executor", "dp_backend"),
    [
        ({"kind": "single"}, 1, None, None),
        ({"kind": "single", "tensor_parallel_size": 2}, 2, "mp", None),
        ({"kind": "data_parallel", "size": 2}, 2, None, "mp"),
        ({"kind": "data_parallel", "size": 2, "tensor_parallel_size": 2}, 4, "mp", "mp"),
    ],
)
def test_an_engine_on_one_node_holds_all_its_gpus_in_its_replica(
    topology: dict[str, Any], gpus: int, executor: str | None, dp_backend: str | None
) -> None:
    plan = plan_placement(_arm(topology, gpus_per_engine=1, gpus_per_node=8))
    assert plan.layout == "replica"
    assert (plan.replicas, plan.replica_gpus, plan.replica_cpus) == (1, gpus, 2)
    assert plan.bundles is None  # no placement group: vLLM would pick its Ray executor inside one
    assert (plan.executor_backend, plan.data_parallel_backend) == (executor, dp_backend)
    assert plan.total_gpus == gpus


def test_tensor_parallelism_larger_than_a_node_uses_ray_serve_llms_recipe() -> None:
    plan = plan_placement(_arm({"kind": "single", "tensor_parallel_size": 8}, gpus_per_engine=1, gpus_per_node=4))
    assert plan.layout == "spanning"
    assert plan.replica_gpus == 0  # the replica holds no GPU: every GPU bundle stays free for vLLM's workers
    assert plan.bundles is not None
    assert plan.bundles[0] == {"CPU": 2, "GPU": 1} and all(b == {"GPU": 1} for b in plan.bundles[1:])
    assert len(plan.bundles) == 8 and plan.executor_backend == "ray" and plan.total_gpus == 8


def test_data_parallelism_larger_than_a_node_runs_vllms_ray_dp_backend_in_internal_load_balancing() -> None:
    from serve_apps.engines.vllm_placement import placement_engine_args

    arm = _arm({"kind": "data_parallel", "size": 2, "tensor_parallel_size": 4}, gpus_per_engine=1, gpus_per_node=4)
    plan = plan_placement(arm)
    assert plan.layout == "ray_dp" and plan.replicas == 1 and plan.replica_gpus == 0 and plan.bundles is None
    assert plan.total_gpus == 8
    # The replica (the front end) anywhere, then one STRICT_PACK group per rank as vLLM makes it.
    assert plan.replica_demand() == [{"CPU": 2}, {"CPU": 1, "GPU": 4}, {"CPU": 1, "GPU": 4}]
    # Internal load balancing (no data_parallel_rank: external LB is refused for dense models); the replica's
    # node holds what its free GPUs can (asked in the replica), every other node as many ranks as it can.
    asked: list[tuple[int, int]] = []
    args = placement_engine_args(arm, local_ranks=lambda dp, tp: asked.append((dp, tp)) or 1)
    assert args == {
        "distributed_executor_backend": "ray", "data_parallel_backend": "ray", "data_parallel_size_local": 1,
    }  # fmt: skip
    assert asked == [(2, 4)]
    assert plan.engine_env == {"VLLM_RAY_DP_PACK_STRATEGY": "fill"}


def test_replicas_and_simulated_ranks_are_one_replica_each() -> None:
    plan = plan_placement(_arm({"kind": "replicas", "size": 3}, gpus_per_engine=1, gpus_per_node=1))
    assert (plan.layout, plan.replicas, plan.replica_gpus, plan.total_gpus) == ("replica", 3, 1, 3)
    sim = plan_placement(_arm({"kind": "data_parallel", "size": 2}, engine="sim", gpus_per_engine=0.5))
    assert (sim.replicas, sim.replica_gpus, sim.executor_backend, sim.data_parallel_backend) == (2, 0.5, None, None)
    cpu = plan_placement(_arm({"kind": "data_parallel", "size": 2, "tensor_parallel_size": 2}))
    assert (cpu.layout, cpu.replicas, cpu.replica_gpus, cpu.executor_backend) == ("cpu", 1, 0, "mp")


@pytest.mark.parametrize(
    ("topology", "resources", "message"),
    [
        (
            {"kind": "data_parallel", "size": 2, "tensor_parallel_size": 8},
            {"gpus_per_engine": 1, "gpus_per_node": 4},
            "one DP rank needs 8 GPUs, the nodes have 4; specdrill runs vLLM's Ray DP backend with each rank on "
            "one node",
        ),
        (
            {"kind": "data_parallel", "size": 4},
            {"gpus_per_engine": 1, "gpus_per_node": 2, "max_engines_per_node": 1},
            "max_engines_per_node cannot apply to a data-parallel group spanning nodes",
        ),
        (
            {"kind": "single", "tensor_parallel_size": 2},
            {"gpus_per_engine": 0.5},
            "uses one whole GPU; resources.gpus_per_engine must be 1, got 0.5",
        ),
        (
            {"kind": "single", "tensor_parallel_size": 8},
            {"gpus_per_engine": 1, "gpus_per_node": 4, "max_engines_per_node": 1},
            "max_engines_per_node cannot apply to an engine spanning nodes",
        ),
    ],
)
def test_layouts_vllm_cannot_run_are_refused_in_one_line(
    topology: dict[str, Any], resources: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        _arm(topology, **resources)
    assert message in str(caught.value)
    assert len(caught.value.errors()) == 1


def test_a_campaign_with_an_unrunnable_layout_is_refused_naming_the_arm() -> None:
    from orchestrator.plan.campaign import Campaign, CampaignError
    from serve_apps.config_io import load_yaml_model

    text = """
name: refuse
engine: {kind: vllm, model: m}
policies: {"off": "off"}
topologies: {dp2tp8: {kind: data_parallel, size: 2, tensor_parallel_size: 8}}
resources: {gpus_per_engine: 1, gpus_per_node: 4}
"""
    with pytest.raises(CampaignError) as caught:
        load_yaml_model(text, Campaign, origin="campaign c.yaml", error=CampaignError)
    line = str(caught.value)
    assert "\n" not in line and "off-dp2tp8" in line and "one DP rank needs 8 GPUs" in line


@pytest.mark.parametrize(
    "key",
    [
        "pipeline_parallel_size", "data_parallel_size_local", "nnodes", "node_rank", "decode_context_parallel_size",
        "prefill_context_parallel_size", "distributed_executor_backend", "data_parallel_backend",
        "data_parallel_rank", "data_parallel_address", "data_parallel_external_lb", "tensor_parallel_size",
    ],
)  # fmt: skip
def test_engine_kwargs_that_placement_owns_are_refused_in_one_line(key: str) -> None:
    from orchestrator.plan.campaign import Campaign, CampaignError
    from serve_apps.config_io import load_yaml_model

    text = f"""
name: owned
engine: {{kind: vllm, model: m, engine_kwargs: {{{key}: 2, max_num_batched_tokens: 4096}}}}
policies: {{"off": "off"}}
topologies: {{one: single}}
"""
    with pytest.raises(CampaignError) as caught:
        load_yaml_model(text, Campaign, origin="campaign c.yaml", error=CampaignError)
    line = str(caught.value)
    assert "\n" not in line
    assert f"engine_kwargs may not set {key}: the arm's policy, topology and placement do" in line


def test_owned_engine_kwargs_are_fields_of_vllms_engine_args() -> None:
    """The refused names are vLLM 0.32's own (a misspelt one would refuse nothing)."""
    pytest.importorskip("vllm")
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    from serve_apps.engine_kinds.vllm_config import (
        ARM_OWNED_ENGINE_ARGS,
        PLACEMENT_OWNED_ENGINE_ARGS,
        VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    )

    fields = {f.name for f in dataclasses.fields(EngineArgs)} | {"placement_group"}  # set on the config (attach)
    assert fields >= (ARM_OWNED_ENGINE_ARGS | PLACEMENT_OWNED_ENGINE_ARGS)
    assert EngineArgs.gpu_memory_utilization == VLLM_DEFAULT_GPU_MEMORY_UTILIZATION


@pytest.mark.parametrize(
    ("gpus", "kwargs", "message"),
    [
        (
            0.5,
            {},
            "arm a: resources.gpus_per_engine 0.5 puts up to 2 engines on one GPU, each taking "
            "gpu_memory_utilization 0.92 (vLLM's default) of its memory: 1.84 > 1; set "
            "engine_kwargs.gpu_memory_utilization to at most 0.5",
        ),
        (
            0.3,
            {"gpu_memory_utilization": 0.4},
            "gpus_per_engine 0.3 puts up to 3 engines on one GPU, each taking gpu_memory_utilization 0.4 "
            "(engine_kwargs) of its memory: 1.2 > 1; set engine_kwargs.gpu_memory_utilization to at most 0.33",
        ),
    ],
)
def test_fractional_gpus_whose_engines_do_not_fit_in_one_gpus_memory_are_refused(
    gpus: float, kwargs: dict[str, Any], message: str
) -> None:
    def arm() -> ArmSpec:
        return ArmSpec.model_validate(
            {
                "name": "a",
                "policy": {"kind": "off"},
                "engine": {"kind": "vllm", "model": "m", "engine_kwargs": kwargs},
                "resources": {"gpus_per_engine": gpus},
            }
        )

    with pytest.raises(ValidationError) as caught:
        arm()
    assert message in str(caught.value) and len(caught.value.errors()) == 1
    kwargs = {"gpu_memory_utilization": 0.3}  # three engines of 0.3 fit one GPU
    plan = plan_placement(arm())
    assert (plan.layout, plan.replica_gpus) == ("replica", gpus)


def test_ray_executor_v2_maps_each_nodes_local_ranks_to_its_sorted_gpu_ids() -> None:
    from serve_apps.engines.placement_probe import v2_devices

    # Ranks in RayExecutorV2's order: two on node a (Ray gave their bundles GPUs 3 and 1), one on node b.
    placed = [{"bundle": 2, "node_id": "a", "gpu_ids": ["3"]}, {"bundle": 0, "node_id": "a", "gpu_ids": ["1"]},
              {"bundle": 1, "node_id": "b", "gpu_ids": ["0"]}]  # fmt: skip
    workers = v2_devices(placed)
    assert [(w["worker"], w["local_rank"], w["device"]) for w in workers] == [(0, 0, 1), (1, 1, 3), (2, 0, 0)]
