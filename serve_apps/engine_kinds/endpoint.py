"""Servers someone else runs (any OpenAI-compatible server, e.g. `vllm serve`): nothing is deployed."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from serve_apps.engine_kinds.base import EngineConfigBase, EngineKind
from serve_apps.engine_kinds.registry import register


class EndpointEngineConfig(EngineConfigBase):
    """Servers someone else runs (any OpenAI-compatible server, e.g. `vllm serve`): nothing is deployed. Each arm
    name maps to its server's base URL; what the server runs is read from its responses' telemetry when it sends
    one (a specdrill arm) and from its /metrics otherwise. The API key comes from the environment variable named
    by `api_key_env` and never enters a file, a trace or a log."""

    kind: Literal["endpoint"] = "endpoint"
    model: str
    urls: dict[str, str] = Field(min_length=1)  # arm name (policy-topology) -> base URL (before /v1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    max_num_seqs: int = Field(default=512, ge=1)
    # The served model's tokenizer (a local path, or a Hugging Face id already in the local cache of every node
    # a load worker runs on; never downloaded): prompt lengths are counted in its tokens. None: in words, said at
    # run start (docs/operator/traffic.md).
    tokenizer: str | None = None

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, v: dict[str, str]) -> dict[str, str]:
        for name, url in v.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"urls.{name}: {url!r} is not an http(s) URL")
        return {name: url.rstrip("/") for name, url in v.items()}


def as_endpoint(config: EngineConfigBase) -> EndpointEngineConfig:
    """Any kind of servers someone else runs (endpoint, sglang, trtllm: their configs are this one's)."""
    if not isinstance(config, EndpointEngineConfig):
        raise TypeError(f"engine kind {config.kind} is not a kind of endpoint")
    return config


class EndpointKind(EngineKind):
    name = "endpoint"
    config: ClassVar[type[EngineConfigBase]] = EndpointEngineConfig  # the sglang and trtllm kinds' are subclasses
    deploys_in_serve = False
    # No step timeline to fetch: the server's /metrics is sampled while a unit runs. The dialect is vLLM's
    # (`vllm serve`, Ray Serve LLM), the default; another server's is another kind (sglang.py, trtllm.py).
    telemetry = "server_metrics"
    can_add_arms = False

    def served_model_name(self, config: EngineConfigBase) -> str:
        return as_endpoint(config).model

    def prompt_tokenizer(self, config: EngineConfigBase) -> str | None:
        return as_endpoint(config).tokenizer

    def prompt_length_notice(self, config: EngineConfigBase) -> str | None:
        endpoint = as_endpoint(config)
        if endpoint.tokenizer is not None:
            return None
        return (
            f"prompt lengths are words: no tokenizer known for endpoint model {endpoint.model}; set engine.tokenizer "
            "(a local path or a cached Hugging Face id) to size prompts in its tokens"
        )

    def max_num_seqs(self, config: EngineConfigBase) -> int | None:
        return as_endpoint(config).max_num_seqs

    def urls(self, config: EngineConfigBase) -> dict[str, str]:
        return as_endpoint(config).urls

    def api_key_env(self, config: EngineConfigBase) -> str | None:
        return as_endpoint(config).api_key_env

    def for_arms(self, config: EngineConfigBase, names: set[str]) -> EngineConfigBase:
        endpoint = as_endpoint(config)
        return endpoint.model_copy(update={"urls": {arm: url for arm, url in endpoint.urls.items() if arm in names}})

    def check_arm_names(self, config: EngineConfigBase, names: set[str]) -> None:
        urls = as_endpoint(config).urls
        missing = sorted(names - set(urls))
        if missing:
            raise ValueError(f"engine.urls: no URL for arm {missing[0]} (arms: {', '.join(sorted(names))})")
        extra = sorted(set(urls) - names)
        if extra:
            raise ValueError(f"engine.urls.{extra[0]}: no such arm (arms: {', '.join(sorted(names))})")


KIND = register(EndpointKind())
