"""TensorRT-LLM servers someone else runs (`trtllm-serve`): an endpoint that speaks TensorRT-LLM's dialect
(dialects/trtllm.py)."""

from __future__ import annotations

from typing import Literal

from serve_apps.engine_kinds.dialects import trtllm
from serve_apps.engine_kinds.endpoint import EndpointEngineConfig, EndpointKind
from serve_apps.engine_kinds.registry import register


class TrtllmEngineConfig(EndpointEngineConfig):
    """TensorRT-LLM servers someone else runs (`trtllm-serve`, with `enable_iter_perf_stats` so its Prometheus
    counters move). Each arm name maps to its server's base URL; /prometheus/metrics is sampled while a unit
    runs. TensorRT-LLM reports no draft length per step, so its schedule is reported not verifiable, never passed
    (docs/operator/verification.md)."""

    kind: Literal["trtllm"] = "trtllm"  # type: ignore[assignment]  # each kind its own literal


class TrtllmKind(EndpointKind):
    name = "trtllm"
    config = TrtllmEngineConfig
    dialect = trtllm.DIALECT


KIND = register(TrtllmKind())
