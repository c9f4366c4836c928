"""vLLM's own step timings: `vllm bench forward --output-json` results (vLLM 0.33 and 0.34) fitted into a profile.

The file, as vllm/benchmarks/forward/main.py writes it (0.33: 259-265 and 288-290; 0.34: 265-271 and 294-296),
is a list with one entry per case:

    [{"case": "b16-k3-c4096",
      "requests": [{"query_len": 4, "kv_len": 4107, "num_draft_tokens": 3, "chunked": false}, ...],
      "median_us": 7301.2,
      "ranks": [{"timing_scope": "target_only", "latency_us": {"median": 7301.2, "sample_spread_pct": 0.1, ...},
                 "drafter": {"num_draft_tokens": 4, ...}, ...}]}]

`requests` are the case's requests after --kv-len-jitter (main.py 0.34:251-253; shapes.py:65-84): kv_len is the
KV length after the step, the prefix plus the query (shapes.py:17-19), which is what the simulator counts as a
request's N_kv (serve_apps/sim/kernel.py), and query_len is what it counts as N_batched. The file keeps each
case's name, not its `--case` text, so a case is read from its requests; a request vLLM itself would refuse
(shapes.py:27-39) is refused here. `median_us` is the forward's median over replays, the slowest rank's per
replay (capture.py:272-303): the target's forward, and the drafter's where `timing_scope` is
"target_and_drafter" (capture.py:154-156). The drafter then proposes the configured num_speculative_tokens,
`drafter.num_draft_tokens`, whatever the case's own drafts (speculator.py 0.34:79, 86; 0.33:78, 85): that is a case's k.
Sampling, rejection sampling and the host's step are not timed (main.py:7-9), so the fitted per-step constant is
the forward's alone and `step_overhead` is kept from the base profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from orchestrator.analysis.steps.stepfit import COEFFICIENTS, StepData, design, huber_fit, quality, unidentified
from orchestrator.calibrate.json_input import read_json_file
from orchestrator.calibrate.writer import fitted_profile, now_iso
from serve_apps.sim.profile import Profile, Provenance

IDLE = {"draft.idle_fixed", "draft.idle_per_request"}  # the bench's drafter always proposes: never measured
DRAFT = {"draft.per_kv_token", "draft.per_draft_token", "draft.fixed"}
UNSTABLE_SPREAD_PCT = 0.5  # vLLM warns above it (main.py 0.34:288-293)


class BenchForwardError(ValueError):
    pass


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class BenchRequest(_Read):
    query_len: int
    kv_len: int
    num_draft_tokens: int = 0
    chunked: bool = False

    @model_validator(mode="after")
    def _as_vllm_checks(self) -> BenchRequest:
        # shapes.py:27-39's rules: a request breaking them was never run, so the file was not written by vLLM
        prefix = self.kv_len - self.query_len
        if self.query_len < 1 or prefix < 0 or self.num_draft_tokens < 0:
            raise ValueError(f"query_len {self.query_len}, kv_len {self.kv_len}, num_draft_tokens "
                             f"{self.num_draft_tokens} is no request (needs query_len >= 1, "
                             "kv_len >= query_len)")  # fmt: skip
        if self.num_draft_tokens and not (prefix > 0 and self.query_len == 1 + self.num_draft_tokens):
            raise ValueError(f"{self.num_draft_tokens} drafts need query_len {1 + self.num_draft_tokens} and a "
                             f"prefix (query_len {self.query_len}, kv_len {self.kv_len})")  # fmt: skip
        return self


class BenchLatency(_Read):
    sample_spread_pct: float = Field(default=0.0, ge=0)


class BenchDrafter(_Read):
    method: str = ""
    num_draft_tokens: int = Field(ge=1)


class BenchRank(_Read):
    timing_scope: Literal["target_only", "target_and_drafter"]
    latency_us: BenchLatency
    drafter: BenchDrafter | None = None


class BenchCase(_Read):
    case: str
    requests: list[BenchRequest] = Field(min_length=1)
    median_us: float = Field(gt=0)
    ranks: list[BenchRank] = Field(min_length=1)

    @model_validator(mode="after")
    def _drafter_says_its_k(self) -> BenchCase:
        rank = self.ranks[0]
        if rank.timing_scope == "target_and_drafter":
            if rank.drafter is None:
                raise ValueError("timing_scope target_and_drafter without the drafter's record (ranks[0].drafter)")
            most = max(r.num_draft_tokens for r in self.requests)
            if most > rank.drafter.num_draft_tokens:  # main.py 0.34:144-149 refuses such a case
                raise ValueError(f"a request verifies {most} drafts, more than the drafter's "
                                 f"{rank.drafter.num_draft_tokens}")  # fmt: skip
        return self

    @property
    def k(self) -> int:
        """The drafter's k where it was timed, else 0 (the target alone)."""
        drafter = self.ranks[0].drafter
        return drafter.num_draft_tokens if drafter and self.ranks[0].timing_scope == "target_and_drafter" else 0


_CASES = TypeAdapter(list[BenchCase])


def _where(data: Any, loc: tuple[int | str, ...]) -> str:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    if loc and isinstance(loc[0], int) and isinstance(data, list) and isinstance(data[loc[0]], dict):
        name = data[loc[0]].get("case")
        if isinstance(name, str):
            text += f" (case {name!r})"
    return text or "the file"


def read_bench_forward(path: str) -> list[BenchCase]:
    data = read_json_file(path, BenchForwardError)
    try:
        cases = _CASES.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        raise BenchForwardError(f"{path}: {_where(data, tuple(first['loc']))}: {message} "
                                "(not `vllm bench forward --output-json` results)") from None  # fmt: skip
    if not cases:
        raise BenchForwardError(f"{path}: no cases (not `vllm bench forward --output-json` results)")
    return cases


@dataclass(frozen=True)
class BenchForwardImport:
    profile: Profile
    lines: list[str]  # the fit's summary, then one line per case: measured, fitted, error


def step_data(cases: list[BenchCase]) -> StepData:
    def column(values: list[float]) -> np.ndarray:
        return np.asarray(values, dtype=float)

    k = column([c.k for c in cases])
    return StepData(
        seconds=column([c.median_us / 1e6 for c in cases]),
        kv=column([sum(r.kv_len for r in c.requests) for c in cases]),
        batched=column([sum(r.query_len for r in c.requests) for c in cases]),
        k=k,
        batch=column([len(c.requests) for c in cases]),
        speculative=k > 0,
    )


def _separable(paths: list[str], x: np.ndarray, drafter: bool) -> list[int]:
    """The columns to fit; the cases that cannot separate one of them are refused in one line naming why."""
    missing = {COEFFICIENTS[j] for j in unidentified(x)} - IDLE - (set() if drafter else DRAFT)
    if missing:
        needs = []
        if missing - DRAFT:
            needs.append("target-only cases (--exclude-drafter) at two contexts and two batch sizes or k")
        if missing & DRAFT:
            needs.append("cases with the drafter from runs at two num_speculative_tokens and two contexts")
        raise BenchForwardError(f"{', '.join(paths)}: the cases cannot separate {', '.join(sorted(missing))} "
                                f"(needs {'; '.join(needs)})")  # fmt: skip
    return [j for j, c in enumerate(COEFFICIENTS) if c not in IDLE and (drafter or c not in DRAFT)]


def _case_line(path: str, case: BenchCase, fitted_s: float) -> str:
    measured_s = case.median_us / 1e6
    tokens = sum(r.query_len for r in case.requests)
    kv = sum(r.kv_len for r in case.requests)
    scope = f"target + drafter k={case.k}" if case.k else "target only"
    spread = case.ranks[0].latency_us.sample_spread_pct
    unstable = f", unstable: sample medians spread {spread:.2f}%" if spread > UNSTABLE_SPREAD_PCT else ""
    n = len(case.requests)
    return (f"  {Path(path).name} {case.case}: {n} request{'s' * (n != 1)}, {tokens} tokens, {kv:,} KV, {scope}: "
            f"{measured_s * 1e3:.3f} ms measured, {fitted_s * 1e3:.3f} fitted, error "
            f"{fitted_s / measured_s - 1:+.2%}{unstable}")  # fmt: skip


def profile_from_bench_forward(paths: list[str], base: Profile, *, name: str) -> BenchForwardImport:
    read = [(path, case) for path in paths for case in read_bench_forward(path)]
    cases = [case for _, case in read]
    data = step_data(cases)
    drafter = bool(data.speculative.any())
    x = design(data)
    fit = huber_fit(x, data.seconds, _separable(paths, x, drafter))
    predicted = fit.predict(x)
    errors = np.abs(predicted / data.seconds - 1.0)
    worst = int(np.argmax(errors))
    q = quality(data.seconds, predicted)
    summary = (f"fit over {len(cases)} cases from {len(paths)} file(s) of vllm bench forward: per-case error median "
               f"{float(np.median(errors)):.2%}, max {errors[worst]:.2%} ({Path(read[worst][0]).name} "
               f"{cases[worst].case}), R^2 {q.r2:.5f}")  # fmt: skip
    kept_draft = "" if drafter else f"; draft costs kept from {base.name} (no case timed the drafter)"
    notes = [
        f"from vllm bench forward {', '.join(paths)} ({len(cases)} cases, "
        f"{int((data.k == 0).sum())} target only, {int((data.k > 0).sum())} with the drafter){kept_draft}",
        "verify.fixed: the forward's per-step constant; step_overhead kept from "
        f"{base.name} ({base.step_overhead:.4g} s): the bench times the forward alone, not sampling, rejection "
        "sampling or the host's step",
        "draft.idle_* not measured (the bench's drafter always proposes its k): written as 0" if drafter else "",
        f"acceptance kept from {base.name} (the bench accepts every draft)",
        *(f"{c} fitted below 0: held at 0" for c in fit.held_at_zero),
    ]
    provenance = Provenance(source="vllm-bench-forward", runs=list(paths), steps=len(cases), fitted=now_iso(),
                            notes=[n for n in notes if n])  # fmt: skip
    profile = fitted_profile(base, name=name, fit=fit, acceptance=[], k_switch_cost_s=0.0, provenance=provenance,
                             step_overhead_s=base.step_overhead)  # fmt: skip
    if not drafter:
        profile = profile.model_copy(update={"draft": base.draft})
    lines = [summary, *(_case_line(p, c, float(s)) for (p, c), s in zip(read, predicted, strict=True))]
    return BenchForwardImport(profile=profile, lines=[*lines, *provenance.notes])
