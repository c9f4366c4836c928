"""What differs in the set-up of two runs, from their manifests: the engine (model, profile, drafter, version),
each common arm's engine facts (vLLM version, model runner, async scheduling, topology, speculative config),
the host and the campaign; and whether they sent the same traffic (seed, shapes, mix, repeats, warm-up, the
load's process), naming what differs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from loadshapes.campaign_files import located_files_replaced
from orchestrator.compare.model import SetupDifference
from orchestrator.plan.campaign import Campaign

# The arm facts a manifest records (run_manifest.arm_entry) that say what ran, in the order they are listed.
ARM_FACTS = (
    ("versions.engine", "engine and version"), ("vllm_version", "vLLM version"), ("model_runner", "model runner"),
    ("executor", "executor"), ("async_scheduling", "async scheduling"), ("cudagraph_mode", "CUDA graph mode"),
    ("max_model_len", "max_model_len"), ("topology_label", "topology"), ("policy_label", "policy"),
    ("resolved_speculative_config", "speculative config (resolved)"), ("schedule_dropped", "schedule dropped"),
)  # fmt: skip


def _dump(campaign: Campaign, field: str) -> Any:
    # Files by their content: two checkouts resolve a replay's relative path to different absolute paths.
    return located_files_replaced(campaign.model_dump(mode="json", by_alias=True, include={field}))[field]


def _shapes_said(before: dict[str, Any], after: dict[str, Any]) -> str:
    parts = [f"{name} differs" for name in before if name in after and before[name] != after[name]]
    parts += [f"{name} in the baseline only" for name in before if name not in after]
    parts += [f"{name} in the candidate only" for name in after if name not in before]
    return "shapes (" + ", ".join(parts) + ")"


def traffic_differences(baseline: Campaign, candidate: Campaign) -> list[str]:
    """What makes two runs' traffic differ, named (seed, shapes, mix, repeats, warm-up, the load's process), then
    the engine. Empty: the same requests, index by index (loadshapes.plan: the traffic seed is the seed, shape and
    repeat; the contents come from the mix), so the runs are compared request by request."""
    found = []
    if baseline.seed != candidate.seed:
        found.append(f"seed ({baseline.seed} / {candidate.seed})")
    shapes = (_dump(baseline, "shapes"), _dump(candidate, "shapes"))
    if shapes[0] != shapes[1]:
        found.append(_shapes_said(*shapes))
    if _dump(baseline, "mix") != _dump(candidate, "mix"):
        found.append("mix")
    for field, said in (("repeats", "repeats"), ("warmup", "warm-up")):
        before, after = _dump(baseline, field), _dump(candidate, field)
        if before != after:
            found.append(f"{said} ({_text(before)} / {_text(after)})")
    keys = {"process", "cv", "repeat_traffic", "workers"}
    load = (baseline.load.model_dump(mode="json", include=keys), candidate.load.model_dump(mode="json", include=keys))
    differing = sorted(k for k in keys if load[0].get(k) != load[1].get(k))
    if differing:
        found.append(f"load ({', '.join(differing)})")
    if not found:
        return found
    engine = _flat(_dump(baseline, "engine")), _flat(_dump(candidate, "engine"))
    keys_differing = sorted(k for k in set(engine[0]) | set(engine[1]) if engine[0].get(k) != engine[1].get(k))
    return [*found, f"engine ({', '.join(keys_differing)})" if keys_differing else "the engine is the same"]


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
    found += _campaign_differences(baseline["campaign"], candidate["campaign"])
    if baseline.get("fingerprint") != candidate.get("fingerprint"):
        found.append(SetupDifference(what="campaign fingerprint", baseline=_text(baseline.get("fingerprint")),
                                     candidate=_text(candidate.get("fingerprint"))))  # fmt: skip
    return found


def _campaign_differences(baseline: dict[str, Any], candidate: dict[str, Any]) -> list[SetupDifference]:
    """The traffic's parts the fingerprint hashes, by name, so the table says which differ: seed, repeats and
    warm-up with their values, each shape's and the mix's differing keys (files by content, as the fingerprint
    counts them)."""
    base, cand = located_files_replaced(baseline), located_files_replaced(candidate)
    found = [
        SetupDifference(what=key, baseline=_text(base.get(key)), candidate=_text(cand.get(key)))
        for key in ("seed", "repeats", "warmup")
        if base.get(key) != cand.get(key)
    ]
    shapes = (base.get("shapes") or {}, cand.get("shapes") or {})
    for name in sorted(set(shapes[0]) | set(shapes[1])):
        if shapes[0].get(name) != shapes[1].get(name):
            before, after = _keys_that_differ(shapes[0].get(name), shapes[1].get(name))
            found.append(SetupDifference(what=f"shape {name}", baseline=before, candidate=after))
    if base.get("mix") != cand.get("mix"):
        before, after = _keys_that_differ(base.get("mix"), cand.get("mix"))
        found.append(SetupDifference(what="mix", baseline=before, candidate=after))
    return found


def _keys_that_differ(before: Any, after: Any) -> tuple[str, str]:
    """Each side's `key=value` for the keys that differ ('-': absent on that side)."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return ("-" if before is None else "present", "-" if after is None else "present")
    flat = _flat(before), _flat(after)
    keys = sorted(k for k in set(flat[0]) | set(flat[1]) if flat[0].get(k) != flat[1].get(k))
    said = [", ".join(f"{k}={side[k]}" for k in keys if k in side) or "-" for side in flat]
    return said[0], said[1]
