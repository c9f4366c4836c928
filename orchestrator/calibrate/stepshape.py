"""Measured verify steps (benchmarks/gpu_step_cost.py's JSON) against a profile's verify cost model.

Two comparisons: the shape, verify(k = 3) / verify(k = 0) by batch and context, measured against the profile's
(a N_kv + b N_batched + c with N_kv = B (C + k + 1) and N_batched = B (k + 1), as the simulator counts a decode
step); and a least-squares fit of the measured points to that same form, with each point's error, so the fitted
coefficients sit beside the profile's. Only the profile's verify term is compared: the measurement has no
drafter and no engine overhead.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.analysis.steps.stepfit import COEFFICIENTS, StepData, design, huber_fit, unidentified
from serve_apps.sim.profile import Profile, ProfileError, VerifyCost, load_profile

SCHEMA = "specdrill.gpu_step_cost/1"
K_HI, K_LO = 3, 0
NAMES = ("a (per_kv_token)", "b (per_batched_token)", "c (fixed)")  # stepfit's first three columns


class MeasuredPoint(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    B: int = Field(gt=0)
    k: int = Field(ge=0)
    C: int = Field(ge=0)
    mode: Literal["graph", "eager"]
    ms: float = Field(gt=0)


class Measured(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    schema_name: Literal["specdrill.gpu_step_cost/1"] = Field(alias="schema")
    machine: dict[str, Any]
    model: dict[str, Any]
    settings: dict[str, Any]
    points: list[MeasuredPoint]
    skipped: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    complete: bool = False


class CompareError(ValueError):
    pass


def load_measured(path: Path) -> Measured:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise CompareError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: not JSON ({exc})") from None
    try:
        measured = Measured.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CompareError(f"{path}: {where}: {first['msg']}") from None
    if not measured.points:
        raise CompareError(f"{path}: no measured points")
    return measured


def verify_seconds(v: VerifyCost, batch: int, k: int, context: int) -> float:
    return v.per_kv_token * batch * (context + k + 1) + v.per_batched_token * batch * (k + 1) + v.fixed


@dataclass(frozen=True)
class Fit:
    cost: VerifyCost  # the measured points' own a, b, c (seconds), same form as a profile's verify
    points: int
    mode: str
    held_at_zero: tuple[str, ...]  # coefficients the data pushed below zero (held at 0, the rest refitted)
    unidentified: tuple[str, ...]  # coefficients these points cannot separate from the others


def fit_verify(points: list[MeasuredPoint]) -> Fit:
    """`specdrill calibrate`'s estimator (Huber on relative residuals, non-negative) on the verify columns."""
    data = StepData(
        seconds=np.array([p.ms / 1e3 for p in points]),
        kv=np.array([p.B * (p.C + p.k + 1) for p in points], dtype=float),
        batched=np.array([p.B * (p.k + 1) for p in points], dtype=float),
        k=np.array([p.k for p in points], dtype=float),
        batch=np.array([p.B for p in points], dtype=float),
        speculative=np.zeros(len(points), dtype=bool),  # a target forward alone: no drafter columns
    )
    x = design(data)
    columns = [0, 1, 2]
    fit = huber_fit(x, data.seconds, columns)
    a, b, c = (float(fit.coef[j]) for j in columns)
    held = tuple(NAMES[COEFFICIENTS.index(name)] for name in fit.held_at_zero)
    lost = tuple(NAMES[j] for j in unidentified(x[:, columns]))
    return Fit(VerifyCost(per_kv_token=a, per_batched_token=b, fixed=c), len(points), points[0].mode, held, lost)


@dataclass(frozen=True)
class RatioRow:
    context: int
    batch: int
    mode: str
    lo_ms: float | None
    hi_ms: float | None
    profile: float
    fitted: float | None

    @property
    def measured(self) -> float | None:
        return None if self.lo_ms is None or self.hi_ms is None else self.hi_ms / self.lo_ms


def ratio_rows(points: list[MeasuredPoint], profile: VerifyCost, fit: Fit | None) -> list[RatioRow]:
    by_key = {(p.mode, p.C, p.B, p.k): p.ms for p in points}
    rows = []
    for mode, context, batch in sorted({(p.mode, p.C, p.B) for p in points}, key=lambda t: (t[0] != "graph", t[1:])):
        lo, hi = by_key.get((mode, context, batch, K_LO)), by_key.get((mode, context, batch, K_HI))
        fitted = None
        if fit is not None and fit.mode == mode:
            fitted = verify_seconds(fit.cost, batch, K_HI, context) / verify_seconds(fit.cost, batch, K_LO, context)
        rows.append(RatioRow(context, batch, mode, lo, hi, verify_seconds(profile, batch, K_HI, context)
                             / verify_seconds(profile, batch, K_LO, context), fitted))
    return rows


def _f(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def render(measured: Measured, profile: Profile, fit: Fit | None, rows: list[RatioRow]) -> str:
    m, s = measured.machine, measured.settings
    out = [
        f"measured: {m.get('gpu', m.get('device', '?'))}, torch {m.get('torch', '?')}, CUDA graphs "
        f"{'on' if s.get('cuda_graphs') else 'off'}, attention {s.get('attention', '?')}, "
        f"{len(measured.points)} points{'' if measured.complete else ' (INCOMPLETE: see skipped / errors)'}",
        f"profile: {profile.name} ({profile.hardware}), verify term only (no drafter, no step overhead)",
    ]
    out += [f"skipped: {line}" for line in measured.skipped] + [f"error: {line}" for line in measured.errors]
    for mode in ("graph", "eager"):
        mode_rows = [r for r in rows if r.mode == mode]
        if not mode_rows:
            continue
        out += ["", f"### verify(k={K_HI}) / verify(k={K_LO}) by batch, {mode} steps", "",
                f"| C | B | k={K_LO} ms | k={K_HI} ms | measured | profile | fitted form |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {r.context} | {r.batch} | {_f(r.lo_ms, '.3f')} | {_f(r.hi_ms, '.3f')} | {_f(r.measured, '.3f')} "
                f"| {r.profile:.3f} | {_f(r.fitted, '.3f')} |" for r in mode_rows]
    if fit is None:
        out += ["", "fit: fewer than 3 points of one mode: no fit"]
        return "\n".join(out)
    pts = [p for p in measured.points if p.mode == fit.mode]
    errs = [(verify_seconds(fit.cost, p.B, p.k, p.C) * 1e3 - p.ms) / p.ms for p in pts]
    v = profile.verify
    caveats = [f"not identified by these points: {', '.join(fit.unidentified)}"] if fit.unidentified else []
    caveats += [f"held at 0 (the data pushed it below): {', '.join(fit.held_at_zero)}"] if fit.held_at_zero else []
    out += ["", f"### fit of the {fit.points} {fit.mode} points to a N_kv + b N_batched + c "
            "(Huber on relative residuals, as `specdrill calibrate`)", *[f"({c})" for c in caveats], "",
            "| | a (s per KV token) | b (s per batched token) | c (s) |", "|---|---|---|---|",
            f"| measured fit | {fit.cost.per_kv_token:.4g} | {fit.cost.per_batched_token:.4g} | {fit.cost.fixed:.4g} |",
            f"| profile {profile.name} | {v.per_kv_token:.4g} | {v.per_batched_token:.4g} | {v.fixed:.4g} |",
            "", f"fit error per point: median |error| {statistics.median(abs(e) for e in errs):.1%}, "
            f"max |error| {max(abs(e) for e in errs):.1%}", "",
            "| C | B | k | measured ms | fit ms | fit error | profile ms |", "|---|---|---|---|---|---|---|"]
    out += [f"| {p.C} | {p.B} | {p.k} | {p.ms:.3f} | {verify_seconds(fit.cost, p.B, p.k, p.C) * 1e3:.3f} | {e:+.1%} "
            f"| {verify_seconds(v, p.B, p.k, p.C) * 1e3:.3f} |"
            for p, e in sorted(zip(pts, errs, strict=True), key=lambda t: (t[0].C, t[0].B, t[0].k))]
    return "\n".join(out)


def compare(measured: Measured, profile: Profile) -> tuple[Fit | None, list[RatioRow]]:
    graph = [p for p in measured.points if p.mode == "graph"]
    pts = graph or [p for p in measured.points if p.mode == "eager"]
    fit = fit_verify(pts) if len(pts) >= 3 else None
    return fit, ratio_rows(measured.points, profile.verify, fit)


def compare_main(path: Path, profile_name: str) -> int:
    try:
        measured = load_measured(path)
        profile = load_profile(profile_name)
    except (CompareError, ProfileError) as exc:
        print(f"gpu_step_cost --compare: {exc}", file=sys.stderr)
        return 2
    fit, rows = compare(measured, profile)
    print(render(measured, profile, fit, rows))
    return 0
