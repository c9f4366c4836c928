"""compare.json: what moved between a baseline run and a candidate run, and whether the release gate failed."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.analysis.opmap.results import RatioCI

ChangeVerdict = Literal["better", "no_change", "worse", "not_comparable"]
Direction = Literal["lower", "higher", "outside_data"]
EngineVerdict = Literal["slower", "faster", "unchanged", "mixed", "not_comparable"]
FailOn = Literal["worse", "engine-slower", "verdict-change", "policy-change", "any"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SetupDifference(_Model):
    what: str = Field(description="the fact that differs: model, engine version, topology, campaign fingerprint...")
    arm: str | None = Field(default=None, description="the arm whose engine fact differs; None: the whole run's")
    baseline: str
    candidate: str


class RunCell(_Model):
    """One run's own cell: the arm against its `off` arm in that run, as its report shows it."""

    requests: int
    verdict: str | None = Field(description="the report's verdict against the run's `off` arm; None: a baseline arm")
    decided_by: str | None = Field(description="the measure whose interval decided the verdict")
    deciding: RatioCI | None = Field(description="that measure's ratio over the run's `off` arm, > 1 favours the arm")
    goodput_rps: float | None = Field(description="SLO-meeting completions per second of the band's clock")
    tpot_p50_s: float | None


class CellChange(_Model):
    """One band and arm: the candidate run's requests against the baseline run's, ratios > 1 favour the candidate."""

    measure: Literal["batch_size", "offered_rate"]
    band: str
    band_index: int
    arm: str
    baseline: RunCell
    candidate: RunCell
    verdict: ChangeVerdict
    paired: bool = Field(description="compared request by request (the same traffic); false: unpaired bootstrap")
    pairs: int
    decided_by: str = Field(description="per-token latency, goodput, both or neither (the map's rule)")
    tpot: RatioCI = Field(description="baseline run's per-token latency / candidate's (geometric means)")
    goodput: RatioCI = Field(description="candidate run's goodput / baseline's")
    noise_explains: bool = Field(description="the deciding ratio's interval holds 1 (or there is none)")
    message: str


class BenefitChange(_Model):
    """Speculation's benefit in one band: a speculative arm's ratio over its `off` arm, candidate run against
    baseline run. The change is the arm's own change over its `off` arm's (two cells of independent units), so
    what moved every arm alike (a slower host, a slower engine) cancels."""

    measure: Literal["batch_size", "offered_rate"]
    band: str
    band_index: int
    arm: str
    off: str = Field(description="the arm's baseline (plain decoding) arm")
    ratio: Literal["per-token", "goodput"] = Field(description="the vs-off ratio compared (the baseline's deciding)")
    baseline: RatioCI | None = Field(description="the arm's ratio over `off` in the baseline run (its map)")
    candidate: RatioCI | None = Field(description="the same ratio in the candidate run (its map)")
    change: RatioCI = Field(description="candidate's benefit / baseline's, > 1: speculation gained")
    verdict: ChangeVerdict = Field(description="better: gained beyond the margin; worse: fell beyond it")
    noise_explains: bool = Field(description="the change's interval holds 1 (or there is none)")
    message: str


class EngineChange(_Model):
    """One `off` arm (plain decoding) against itself across the runs: the engine's own change, speculation aside."""

    arm: str
    cells: int = Field(description="its comparable cells (both band sets)")
    slower: int = Field(description="cells worse beyond the margin")
    faster: int = Field(description="cells better beyond the margin")
    median: float | None = Field(description="the median per-token ratio of its cells, > 1: faster")
    low: float | None = Field(description="the smallest per-token ratio among its cells")
    high: float | None = Field(description="the largest")
    verdict: EngineVerdict
    message: str


class VerdictChange(_Model):
    measure: Literal["batch_size", "offered_rate"]
    band: str
    arm: str
    baseline: str
    candidate: str
    noise_explains: bool = Field(
        description="the two runs' intervals of the deciding ratio overlap (or one has none): noise can explain it"
    )
    message: str


class CrossoverMove(_Model):
    measure: Literal["batch_size", "offered_rate"]
    arm: str
    baseline_band: str | None = Field(description="where the arm stopped helping in the baseline; None: never")
    candidate_band: str | None
    direction: Direction = Field(
        description="lower: it stops helping at a lower load; outside_data: the "
        "crossover lies where the other run has no verdict"
    )
    noise_explains: bool = Field(
        description="no verdict change between the two bands is beyond the intervals: noise can explain the move"
    )
    message: str


class PolicyChange(_Model):
    arm: str
    message: str


class Comparison(_Model):
    """compare.json."""

    baseline_run: str
    candidate_run: str
    baseline_dir: str
    candidate_dir: str
    arms: list[str] = Field(description="the arms compared (both runs ran them)")
    paired: bool = Field(description="the traffic fingerprints match: cells are compared request by request")
    traffic: str = Field(description="one line: same traffic or not, and how the cells are compared")
    traffic_differences: list[str] = Field(
        default_factory=list, description="what differs in the traffic (seed, shapes, mix, ...), then the engine"
    )
    allow_different_traffic: bool = Field(default=False, description="the operator let a gate judge other traffic")
    setup: list[SetupDifference]
    benefit_changes: list[BenefitChange] = Field(default_factory=list)
    engine_changes: list[EngineChange] = Field(default_factory=list)
    cells: list[CellChange]
    verdict_changes: list[VerdictChange]
    crossover_moves: list[CrossoverMove]
    policy_changes: list[PolicyChange]
    recommended: list[str] = Field(default_factory=list, description="each run's supported k per batch band")
    answer: str = Field(description="the paragraph for a release review")
    margin: float
    fail_on: list[FailOn]
    gate_failures: list[str] = Field(description="why the gate failed, one line each; empty: passed or no gate")
