"""The step-time model and its robust fit.

seconds = v_kv N_kv + v_b N_batched + C                              (every step: the target's verify pass)
        + d_kv N_kv + d_tok k + d_fixed        where speculative and k > 0 (the drafter proposes k)
        + idle_fixed + idle_req batch           where speculative and k = 0 (the drafter keeps its state)

C is verify.fixed + step_overhead: both are paid once per step, so no data separates them and they are one
coefficient. The loss is Huber's on the relative residual (step times span two orders of magnitude and a few
steps are disturbed by the host), solved by iteratively reweighted least squares in numpy: neither scipy nor
statsmodels is a dependency of specdrill. Coefficients are non-negative (the profile's schema): one the data
push below zero is held at 0 and the rest refitted, and the fit says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

COEFFICIENTS = (
    "verify.per_kv_token", "verify.per_batched_token", "verify.fixed + step_overhead",
    "draft.per_kv_token", "draft.per_draft_token", "draft.fixed", "draft.idle_fixed", "draft.idle_per_request",
)  # fmt: skip
HUBER_C = 1.345  # 95% efficiency at the normal
Z95 = 1.959964
_SEPARABLE = 1e-7  # a column whose distance to the span of the others is below this (relative) is not identified


@dataclass(frozen=True)
class StepData:
    seconds: np.ndarray
    kv: np.ndarray
    batched: np.ndarray
    k: np.ndarray
    batch: np.ndarray
    speculative: np.ndarray  # bool per step


def design(d: StepData) -> np.ndarray:
    drafting = d.speculative & (d.k > 0)
    idle = d.speculative & (d.k == 0)
    one = np.ones(len(d.seconds))
    return np.column_stack(
        [d.kv, d.batched, one, d.kv * drafting, d.k * drafting, 1.0 * drafting, 1.0 * idle, d.batch * idle]
    )


def unidentified(x: np.ndarray) -> list[int]:
    """Columns the data cannot separate from the others (or that no step exercises)."""
    norms = np.linalg.norm(x, axis=0)
    out = []
    scaled = x / np.where(norms > 0, norms, 1.0)
    for j in range(x.shape[1]):
        if norms[j] == 0:
            out.append(j)
            continue
        others = np.delete(scaled, j, axis=1)
        coef, *_ = np.linalg.lstsq(others, scaled[:, j], rcond=None)
        if np.linalg.norm(scaled[:, j] - others @ coef) < _SEPARABLE:
            out.append(j)
    return out


@dataclass(frozen=True)
class Fit:
    coef: np.ndarray  # seconds per unit of each column, COEFFICIENTS order (0 where not fitted)
    fitted: np.ndarray  # bool: the column was fitted (identified, some step exercises it)
    held_at_zero: tuple[str, ...]
    steps: int
    iterations: int
    stderr: np.ndarray  # the coefficients' standard errors (Huber sandwich at the final weights; 0 where not fitted)

    def interval(self, j: int) -> tuple[float, float]:
        half = Z95 * float(self.stderr[j])
        return float(self.coef[j]) - half, float(self.coef[j]) + half

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x @ self.coef)

    def scaled(self, factor: float) -> Fit:
        return dataclasses.replace(self, coef=self.coef * factor, stderr=self.stderr * factor)


def huber_fit(x: np.ndarray, y: np.ndarray, columns: list[int], *, max_iter: int = 100) -> Fit:
    """Huber regression of y on x[:, columns], relative residuals, non-negative coefficients."""
    active = list(columns)
    held: list[str] = []
    a_all = x / y[:, None]
    iterations = 0
    while True:
        a = a_all[:, active]
        norms = np.linalg.norm(a, axis=0)
        a = a / norms
        w = np.ones(len(y))
        beta = np.zeros(len(active))
        for iterations in range(1, max_iter + 1):  # noqa: B007 (reported)
            sw = np.sqrt(w)
            new, *_ = np.linalg.lstsq(a * sw[:, None], sw, rcond=None)
            r = 1.0 - a @ new
            scale = max(1.4826 * float(np.median(np.abs(r - np.median(r)))), 1e-9)
            w = np.minimum(1.0, HUBER_C * scale / np.maximum(np.abs(r), 1e-300))
            done = np.allclose(new, beta, rtol=1e-9, atol=1e-12)
            beta = new
            if done:
                break
        coef_active = beta / norms
        # The covariance of the weighted least squares at the final weights, in the residuals' own scale: the
        # usual approximation for an M-estimator (Huber 1981, 7.6), enough to tell two fits' coefficients apart.
        weighted = a * np.sqrt(w)[:, None]
        dof = max(len(y) - len(active), 1)
        sigma2 = float(np.sum(w * r**2)) / dof
        cov = sigma2 * np.linalg.pinv(weighted.T @ weighted)
        se_active = np.sqrt(np.maximum(np.diag(cov), 0.0)) / norms
        negative = [i for i, c in enumerate(coef_active) if c < 0]
        if not negative:
            break
        worst = min(negative, key=lambda i: coef_active[i])
        held.append(COEFFICIENTS[active[worst]])
        active.pop(worst)
    coef = np.zeros(x.shape[1])
    coef[active] = coef_active
    fitted = np.zeros(x.shape[1], dtype=bool)
    fitted[active] = True
    stderr = np.zeros(x.shape[1])
    stderr[active] = se_active
    return Fit(coef=coef, fitted=fitted, held_at_zero=tuple(held), steps=len(y), iterations=iterations,
               stderr=stderr)  # fmt: skip


@dataclass(frozen=True)
class Quality:
    steps: int
    r2: float
    error_p50: float  # relative error of the predicted step-time median against the measured one
    error_p95: float
    per_step_error_p50: float  # median of |predicted - measured| / measured, step by step


def quality(y: np.ndarray, predicted: np.ndarray) -> Quality:
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - predicted) ** 2)) / total if total > 0 else float("nan")
    p50, p95 = np.quantile(y, [0.5, 0.95])
    q50, q95 = np.quantile(predicted, [0.5, 0.95])
    return Quality(
        steps=len(y),
        r2=r2,
        error_p50=float(q50 / p50 - 1.0),
        error_p95=float(q95 / p95 - 1.0),
        per_step_error_p50=float(np.median(np.abs(predicted - y) / y)),
    )
