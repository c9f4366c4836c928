"""SGLang's adaptive speculative steps as an arm's policy (`kind: sglang_adaptive`), in SGLang's own terms.

`num_steps` is `--speculative-num-steps` (each slot starts there when it is one of its candidates), `adaptive_config`
is what `--speculative-adaptive-config` would read (SGLang 0.5.23 speculative/adaptive_spec_params.py 103-139:
integer-string keys are slots, other keys shared settings); the default is SGLang's DEFAULT_ADAPTIVE_CONFIG
(28-53). The rule itself: serve_apps/sim/rules/sglang_adaptive.py. specdrill's k is SGLang's steps (the drafts
proposed; SGLang's num_draft_tokens = steps + 1 counts the verified root token).
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from serve_apps.resolved import SINGLE, ResolvedSpeculation, SglangRule, SglangTier, StrictModel, Topology

_SHARED = {"ema_alpha", "update_interval", "warmup_batches"}
_SLOT = {"candidate_steps", "up_hysteresis", "down_hysteresis", "ceiling_coeff"}


def parse_adaptive_config(config: dict[str, Any]) -> tuple[tuple[SglangTier, ...], dict[str, Any]]:
    """_load_adaptive_config's checks (113-138): slots sorted by key, and the shared settings."""
    tiers: list[SglangTier] = []
    shared: dict[str, Any] = {}
    for key, entry in config.items():
        if not key.isdigit():
            if key not in _SHARED:
                raise ValueError(f"adaptive_config key {key!r}: expected a batch size or one of {sorted(_SHARED)}")
            shared[key] = entry
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(type(s) is int and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        unknown = set(entry) - _SLOT
        if unknown:
            raise ValueError(f"BS {key}: {sorted(unknown)} not modelled per slot (shared: {sorted(_SHARED)})")
        if int(key) < 1:
            raise ValueError(f"BS {key}: batch-size keys start at 1")
        tiers.append(SglangTier(lower_bound=int(key), **{**entry, "candidate_steps": tuple(sorted(set(steps)))}))
    if not tiers:
        raise ValueError('adaptive_config must contain at least one integer-string BS key, e.g. {"1": {...}}')
    return tuple(sorted(tiers, key=lambda t: t.lower_bound)), shared


def _default_config() -> dict[str, Any]:
    return {
        "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
        "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
        "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
        "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    }


class SglangAdaptivePolicy(StrictModel):
    kind: Literal["sglang_adaptive"] = "sglang_adaptive"
    method: Literal["eagle", "eagle3"] = Field(
        description="SGLang's EAGLE / EAGLE3 (topk 1): the only algorithms adaptive mode runs with"
    )
    model: str = Field(description="the drafter (`--speculative-draft-model-path`)")
    num_steps: int = Field(
        ge=0, description="`--speculative-num-steps`: where each slot starts, and the static fallback"
    )
    adaptive_config: dict[str, Any] = Field(
        default_factory=_default_config,
        description=(
            "`--speculative-adaptive-config` as SGLang reads it: batch-size keys (lower bounds after CUDA-graph "
            "padding) with `candidate_steps`, `up_hysteresis`, `down_hysteresis`, `ceiling_coeff`; shared "
            "`ema_alpha` (0.2), `update_interval` (5), `warmup_batches` (10). Default: SGLang's shipped slots"
        ),
    )
    cuda_graph: bool = Field(default=True, description="decode CUDA graphs on: batches are padded to a graph size")
    cuda_graph_max_bs: int | None = Field(
        default=None, ge=1, description="`--cuda-graph-max-bs` (default: 256 on an 80 GB GPU, at most max_num_seqs)"
    )

    @model_validator(mode="after")
    def _config_as_sglang(self) -> Self:
        parse_adaptive_config(self.adaptive_config)
        return self

    @property
    def rule(self) -> SglangRule:
        tiers, shared = parse_adaptive_config(self.adaptive_config)
        return SglangRule(
            tiers=tiers, initial_steps=self.num_steps, cuda_graph=self.cuda_graph,
            cuda_graph_max_bs=self.cuda_graph_max_bs, **shared,
        )  # fmt: skip

    @property
    def max_k(self) -> int:
        """The most drafts a step can propose: the largest candidate of any slot (SGLang sizes buffers so)."""
        return max(max(t.candidate_steps) for t in self.rule.tiers)

    @property
    def label(self) -> str:
        slots = ",".join(f"{t.lower_bound}:{'/'.join(map(str, t.candidate_steps))}" for t in self.rule.tiers)
        return f"sglang-adaptive-{self.method}-s{self.num_steps}[{slots}]"

    def to_engine_config(self) -> dict[str, Any]:
        """SGLang's server arguments for this policy."""
        return {
            "speculative_algorithm": self.method.upper(), "speculative_draft_model_path": self.model,
            "speculative_num_steps": self.num_steps, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": self.num_steps + 1, "speculative_adaptive": True,
            "speculative_adaptive_config": self.adaptive_config,
        }  # fmt: skip

    def resolve(self, topology: Topology = SINGLE, vllm: Any = None) -> ResolvedSpeculation:
        """What SGLang runs. Under data parallelism SGLang refuses adaptive mode and runs the static steps
        (adaptive_spec_params.py 80-84: "attention DP is not supported"; arg_groups/speculative_hook.py
        1374-1390 logs the fall-back)."""
        if topology.data_parallel_size > 1:
            return ResolvedSpeculation(
                method=self.method, num_speculative_tokens=self.num_steps, schedule=None, schedule_dropped=True,
                dropped_reason=(
                    f"data_parallel_size={topology.data_parallel_size}: SGLang disables speculative_adaptive "
                    f"(attention DP is not supported) and runs static speculative_num_steps={self.num_steps}"
                ),
            )  # fmt: skip
        return ResolvedSpeculation(method=self.method, num_speculative_tokens=self.max_k, schedule=None, rule=self.rule)
