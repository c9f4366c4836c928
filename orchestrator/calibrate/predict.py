"""The prediction check: the run's campaign replayed in virtual time on the fitted profile, and per arm the
measured against the predicted per-token latency p50 / p90 and E2E p50 (DuckDB quantiles over ok requests)."""

from __future__ import annotations

import tempfile
from collections.abc import Collection
from dataclasses import dataclass

from orchestrator.analysis.source import run_requests
from orchestrator.report import RunInputs, load_run
from orchestrator.simulate_campaign import simulate_campaign
from serve_apps.arms import SimulatedEngineConfig

MEASURES = ("tpot_p50", "tpot_p90", "e2e_p50")
_SQL = """
SELECT arm, quantile_cont(tpot, 0.5), quantile_cont(tpot, 0.9), quantile_cont(e2e, 0.5)
FROM requests WHERE ok GROUP BY arm ORDER BY arm
"""


@dataclass(frozen=True)
class Prediction:
    arm: str
    measured: dict[str, float]
    predicted: dict[str, float]

    def ratio(self, measure: str) -> float:
        return self.predicted[measure] / self.measured[measure]


def arm_quantiles(inputs: RunInputs, *, repeats: Collection[int] | None = None) -> dict[str, dict[str, float]]:
    units = [(u.unit.arm, u.unit.shape, u.unit.repeat) for u in inputs.units
             if repeats is None or u.unit.repeat in repeats]  # fmt: skip
    requests = run_requests(inputs.store.root, units)
    try:
        rows = requests.con.execute(_SQL).fetchall()
    finally:
        requests.close()
    return {str(r[0]): dict(zip(MEASURES, map(float, r[1:]), strict=True)) for r in rows if None not in r}


def predict(inputs: RunInputs, profile_path: str, *, repeats: Collection[int] | None = None) -> list[Prediction]:
    """`repeats`: compare (and simulate) only these repeats: the held-out units of a fit on the others."""
    engine = inputs.campaign.engine
    seed = getattr(engine, "seed", 0)
    campaign = inputs.campaign.model_copy(update={"engine": SimulatedEngineConfig(profile=profile_path, seed=seed)})
    measured = arm_quantiles(inputs, repeats=repeats)
    with tempfile.TemporaryDirectory(prefix="specdrill-calibrate-") as out:
        simulate_campaign(campaign, output=out)
        predicted = arm_quantiles(load_run(out), repeats=repeats)
    return [Prediction(arm, measured[arm], predicted[arm]) for arm in sorted(measured) if arm in predicted]
