"""Step time of one engine step from the profile's fitted cost model (vectorised over candidate steps)."""

from __future__ import annotations

import numpy as np

from serve_apps.sim.profile import Profile


def step_seconds(
    profile: Profile,
    *,
    kv_tokens: np.ndarray,
    batched_tokens: np.ndarray,
    k: int,
    batch_size: int,
    speculative: bool,
) -> np.ndarray:
    """verify(N_kv, N_batched) + draft(N_kv, k) + per-step overhead.

    A speculative engine whose scheduled k is 0 still pays the drafter's idle cost: vLLM keeps the drafter in
    step (measured: an all-zero schedule is slower than no speculation, see calibration notes).
    """
    v = profile.verify
    verify = v.per_kv_token * kv_tokens + v.per_batched_token * batched_tokens + v.fixed
    d = profile.draft
    draft: float | np.ndarray
    if not speculative:
        draft = 0.0
    elif k == 0:
        draft = d.idle_fixed + d.idle_per_request * batch_size
    elif d.kind == "model":
        draft = d.per_kv_token * kv_tokens + d.per_draft_token * k + d.fixed
    else:
        draft = d.fraction * verify
    return np.asarray(verify + draft + profile.step_overhead, dtype=np.float64)
