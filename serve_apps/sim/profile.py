"""Hardware/model profiles for the simulated engine: validated YAML data files.

A profile says how long one engine step takes on some hardware (a fitted cost model), what the engine's limits
are, and how often the drafter's tokens are accepted for each workload category. Shipped profiles live in
serve_apps/profiles/; a user points `--profile` at a YAML file of their own to model their hardware.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_apps.config_io import load_yaml_model, read_text

PROFILE_DIR = "profiles"
MAX_PROFILE_BYTES = 8 << 20  # a profile is ~2 KiB


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class VerifyCost(_Strict):
    """Target-model forward: seconds = per_kv_token * N_kv + per_batched_token * N_batched + fixed."""

    per_kv_token: float = Field(ge=0)
    per_batched_token: float = Field(ge=0)
    fixed: float = Field(ge=0)


class DraftCost(_Strict):
    """Drafter cost per step.

    kind "model" (EAGLE, draft models): per_kv_token * N_kv + per_draft_token * k + fixed.
    kind "fraction_of_verify" (n-gram lookup on the CPU): fraction * verify seconds.
    idle_* is what a speculative engine still pays in a step whose scheduled k is 0 (the drafter keeps its
    state in sync), which is why a dynamic schedule of all zeros is slower than no speculation at all.
    """

    kind: Literal["model", "fraction_of_verify"]
    per_kv_token: float = Field(default=0.0, ge=0)
    per_draft_token: float = Field(default=0.0, ge=0)
    fixed: float = Field(default=0.0, ge=0)
    fraction: float = Field(default=0.0, ge=0)
    idle_fixed: float = Field(default=0.0, ge=0)
    idle_per_request: float = Field(default=0.0, ge=0)


class EngineLimits(_Strict):
    max_num_seqs: int = Field(gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    kv_cache_tokens: int = Field(gt=0)
    block_size: int = Field(default=16, gt=0)
    # The most draft tokens the drafter proposes per step: a fixed k or a dynamic max k above it is refused.
    # None: no limit (vLLM sets none for EAGLE or n-gram drafters).
    max_draft_tokens: int | None = Field(default=None, gt=0)


class CategoryAcceptance(_Strict):
    """Per-position conditional acceptance: position i is accepted with per_position[i] given 1..i-1 were.

    Positions past the list reuse its last value. draft_availability is the chance the drafter proposes at all
    in a step (n-gram finds no match sometimes); a step where it proposes nothing has zero draft tokens.
    """

    per_position: list[float] = Field(min_length=1)
    draft_availability: float = Field(default=1.0, ge=0, le=1)

    @field_validator("per_position")
    @classmethod
    def _probabilities(cls, v: list[float]) -> list[float]:
        for i, p in enumerate(v):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"per_position[{i}] = {p} is not a probability in [0, 1]")
        return v

    def prob(self, position: int) -> float:
        return self.per_position[min(position, len(self.per_position) - 1)]


class Provenance(_Strict):
    """What a fitted profile was fitted from (`specdrill calibrate`): shipped profiles have none."""

    source: Literal["timelines", "vllm-profile", "vllm-bench-forward"]
    runs: list[str] = Field(default_factory=list)  # run ids, or the profiler / bench files
    arms: list[str] = Field(default_factory=list)
    steps: int = Field(default=0, ge=0)  # engine steps the cost model was fitted over
    fitted: str  # ISO date-time, UTC
    notes: list[str] = Field(default_factory=list)  # what was not fitted, what was fitted as one


class Profile(_Strict):
    name: str
    description: str = ""
    hardware: str
    model: str
    drafter_method: str
    drafter_model: str | None = None
    verify: VerifyCost
    draft: DraftCost
    step_overhead: float = Field(ge=0)
    # Extra seconds a step pays when its k differs from the engine's previous step's (vLLM #49548: a schedule
    # crossing its threshold re-selects kernels / graphs); 0 in the shipped profiles.
    k_switch_cost_s: float = Field(default=0.0, ge=0)
    limits: EngineLimits
    acceptance: dict[str, CategoryAcceptance] = Field(min_length=1)
    # A request's category with no acceptance of its own (a data set's: Spec-Bench's `coding`, ShareGPT's `sharegpt`)
    # uses the acceptance of the category `category_map` names for it, else `default_category`'s; with neither it
    # is refused. The run says which categories fell back and for how many requests (analysis/opmap/categories.py).
    category_map: dict[str, str] = Field(default_factory=dict)
    default_category: str | None = None
    calibration_notes: str = ""
    provenance: Provenance | None = None

    @model_validator(mode="after")
    def _steps_take_time(self) -> Profile:
        # Every step verifies at least one token over at least one KV token: with all of these 0 a step takes no
        # time, virtual time never advances, and every latency and speedup divides by zero.
        v = self.verify
        if not v.per_kv_token + v.per_batched_token + v.fixed + self.step_overhead > 0:
            raise ValueError(
                "verify (per_kv_token, per_batched_token, fixed) and step_overhead are all 0: a step would take no "
                "time; give at least one a positive cost"
            )
        return self

    @model_validator(mode="after")
    def _fallbacks_exist(self) -> Profile:
        named = {f"category_map.{k}": v for k, v in self.category_map.items()}
        if self.default_category is not None:
            named["default_category"] = self.default_category
        for key, target in sorted(named.items()):
            if target not in self.acceptance:
                raise ValueError(f"{key} = {target!r}: the profile has no acceptance for it "
                                 f"(has: {', '.join(sorted(self.acceptance))})")  # fmt: skip
        return self

    def resolve_category(self, category: str) -> str | None:
        """The category whose acceptance a request of `category` uses: its own, its mapped one, the default, or
        None where the profile has none for it."""
        if category in self.acceptance:
            return category
        return self.category_map.get(category, self.default_category)

    def acceptance_for(self, category: str) -> CategoryAcceptance:
        used = self.resolve_category(category)
        if used is None:
            raise KeyError(
                f"profile {self.name!r} has no acceptance for workload category {category!r} "
                f"(has: {', '.join(sorted(self.acceptance))}; a profile's category_map or default_category names "
                "one for the others)"
            )
        return self.acceptance[used]


class ProfileError(ValueError):
    pass


def shipped_profiles() -> list[str]:
    root = resources.files("serve_apps").joinpath(PROFILE_DIR)
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str) -> Profile:
    """The profile a name (shipped) or a YAML path names. The file is read on every call, parsed once per path and
    content: a file changed on disk is parsed again; a campaign holds its engine's profile once it has it
    (serve_apps/engine_kinds/simulated.py), so one campaign load reads it once."""
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml"} or path.exists():
        if path.is_file() and path.stat().st_size > MAX_PROFILE_BYTES:  # parsed whole, at ~50x its size
            raise ProfileError(f"profile file {path}: {path.stat().st_size >> 20} MiB, over the "
                               f"{MAX_PROFILE_BYTES >> 20} MiB a profile may be")  # fmt: skip
        text = read_text(path, "profile file", ProfileError)
        origin, where = str(path), str(path.resolve())
    else:
        resource = resources.files("serve_apps").joinpath(PROFILE_DIR, f"{name_or_path}.yaml")
        if not resource.is_file():
            raise ProfileError(
                f"unknown profile {name_or_path!r}; shipped: {', '.join(shipped_profiles())}, or give a YAML path"
            )
        text = resource.read_text()
        origin, where = name_or_path, str(resource)
    return _parsed(where, text, origin)


@functools.lru_cache(maxsize=64)
def _parsed(where: str, text: str, origin: str) -> Profile:
    """One parse per (resolved path, content, name it was given by: its errors say that name). A Profile is frozen,
    so the callers that get the same one cannot change it for each other."""
    return load_yaml_model(text, Profile, origin=f"profile {origin}", error=ProfileError)


def profile_parses() -> tuple[int, int]:
    """(parsed, handed back already parsed) since the process started: how often a profile's YAML was parsed."""
    info = _parsed.cache_info()
    return info.misses, info.hits
