"""SGLang servers someone else runs (`python -m sglang.launch_server ... --enable-metrics`): an endpoint that speaks
SGLang's dialect (dialects/sglang.py)."""

from __future__ import annotations

from typing import Literal

from serve_apps.engine_kinds.dialects import sglang
from serve_apps.engine_kinds.endpoint import EndpointEngineConfig, EndpointKind
from serve_apps.engine_kinds.registry import register


class SglangEngineConfig(EndpointEngineConfig):
    """SGLang servers someone else runs, started with `--enable-metrics` (else nothing reconciles). Each arm name
    maps to its server's base URL; each request asks for its speculation details (`return_spec_tokens_details`),
    and /metrics is sampled while a unit runs. SGLang reports no step's draft length, so which draft length ran
    at which batch size is reported not verifiable (docs/operator/verification.md)."""

    kind: Literal["sglang"] = "sglang"  # type: ignore[assignment]  # each kind its own literal


class SglangKind(EndpointKind):
    name = "sglang"
    config = SglangEngineConfig
    dialect = sglang.DIALECT


KIND = register(SglangKind())
