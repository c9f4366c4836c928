"""A base profile far from the truth, for calibrate's --base: a fit that returned its base unchanged (or kept any
cost or acceptance of it) fails every comparison with the profile that generated the data; and the step costs a
run's timelines identify, truth beside fitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from serve_apps.sim.profile import Profile
from tests import REPO

SHIPPED = "llama3.1-8b-h100-eagle"


def distant_base(directory: Path, *, base: str = SHIPPED, costs: float = 3.0, step_overhead: float | None = None,
                 acceptance: float | None = 0.3, name: str = "distant") -> Path:  # fmt: skip
    """`base` (a shipped profile) with every verify and draft cost times `costs`, step_overhead times
    `step_overhead` (default: `costs`), and every position of every category's acceptance `acceptance` (None: the
    base's), written under `directory`."""
    data: dict[str, Any] = yaml.safe_load((REPO / "serve_apps" / "profiles" / f"{base}.yaml").read_text())
    data["name"] = name
    for group in ("verify", "draft"):
        data[group] = {k: v * costs if isinstance(v, float) else v for k, v in data[group].items()}
    data["step_overhead"] *= costs if step_overhead is None else step_overhead
    if acceptance is not None:
        data["acceptance"] = {c: {"per_position": [acceptance] * 3} for c in data["acceptance"]}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def step_costs(truth: Profile, fitted: Profile) -> dict[str, tuple[float, float]]:
    """Every step cost a run's timelines identify: name -> (truth's, fitted)."""
    return {
        "verify.per_kv_token": (truth.verify.per_kv_token, fitted.verify.per_kv_token),
        "verify.per_batched_token": (truth.verify.per_batched_token, fitted.verify.per_batched_token),
        # the two per-step constants are one column of the design: fitted as their sum
        "per-step sum": (truth.verify.fixed + truth.step_overhead, fitted.verify.fixed + fitted.step_overhead),
        "draft.per_kv_token": (truth.draft.per_kv_token, fitted.draft.per_kv_token),
        "draft.per_draft_token": (truth.draft.per_draft_token, fitted.draft.per_draft_token),
        "draft.fixed": (truth.draft.fixed, fitted.draft.fixed),
        "draft.idle_fixed": (truth.draft.idle_fixed, fitted.draft.idle_fixed),
        "draft.idle_per_request": (truth.draft.idle_per_request, fitted.draft.idle_per_request),
    }
