"""What differs in the set-up of two runs, from their manifests: the engine (model, profile, drafter, version),
each common arm's engine facts (vLLM version, model runner, async scheduling, topology, speculative config),
the host and the campaign; and whether they sent the same traffic (the traffic fingerprint)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from orchestrator.campaign import Campaign
from orchestrator.compare.model import SetupDifference

# The arm facts a manifest records (run_manifest.arm_entry) that say what ran, in the order they are listed.
ARM_FACTS = (
    ("versions.engine", "engine and version"), ("vllm_version", "vLLM version"), ("model_runner", "model runner"),
    ("executor", "executor"), ("async_scheduling", "async scheduling"), ("cudagraph_mode", "CUDA graph mode"),
    ("max_model_len", "max_model_len"), ("topology_label", "topology"), ("policy_label", "policy"),
    ("resolved_speculative_config", "speculative config (resolved)"), ("schedule_dropped", "schedule dropped"),
)  # fmt: skip


def traffic_fingerprint(campaign: Campaign) -> str:
    """What decides the requests a run sends (loadshapes.plan: the traffic seed is the seed, shape and repeat; the
    contents come from the mix): two runs with the same one sent the same requests, index by index."""
    data = campaign.model_dump(mode="json", by_alias=True, include={"seed", "shapes", "mix", "repeats", "warmup"})
    load = campaign.load.model_dump(mode="json", include={"process", "cv", "repeat_traffic", "workers"})
    text = json.dumps({**data, "load": load}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flat(value: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): json.dumps(value, sort_keys=True) if isinstance(value, list) else str(value)}


def _get(entry: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        entry = entry.get(part) if isinstance(entry, dict) else None  # type: ignore[assignment]
    return entry


def _text(value: Any) -> str:
    if value is None:
        return "-"
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value)


def setup_differences(
    baseline: dict[str, Any], candidate: dict[str, Any], arms: Sequence[str]
) -> list[SetupDifference]:
    """Manifests in, differences out: the engine section of the campaign, the run's mode and host, specdrill's
    and the engines' versions, each common arm's engine facts, and the campaign fingerprint."""
    found: list[SetupDifference] = []
    base_engine, cand_engine = (
        _flat(baseline["campaign"].get("engine", {})),
        _flat(candidate["campaign"].get("engine", {})),
    )
    for key in sorted(set(base_engine) | set(cand_engine)):
        if base_engine.get(key) != cand_engine.get(key):
            found.append(SetupDifference(what=f"engine.{key}", baseline=base_engine.get(key, "-"),
                                         candidate=cand_engine.get(key, "-")))  # fmt: skip
    for what, path in (("mode", "mode"), ("host", "host.hostname"), ("platform", "host.platform"),
                       ("specdrill", "versions.specdrill"), ("vllm", "versions.vllm")):  # fmt: skip
        before, after = _text(_get(baseline, path)), _text(_get(candidate, path))
        if before != after:
            found.append(SetupDifference(what=what, baseline=before, candidate=after))
    base_arms, cand_arms = baseline.get("arms") or {}, candidate.get("arms") or {}
    for arm in arms:
        for path, what in ARM_FACTS:
            before = _text(_get(base_arms.get(arm) or {}, path))
            after = _text(_get(cand_arms.get(arm) or {}, path))
            if before != after:
                found.append(SetupDifference(what=what, arm=arm, baseline=before, candidate=after))
    if baseline.get("fingerprint") != candidate.get("fingerprint"):
        found.append(SetupDifference(what="campaign fingerprint", baseline=_text(baseline.get("fingerprint")),
                                     candidate=_text(candidate.get("fingerprint"))))  # fmt: skip
    return found
