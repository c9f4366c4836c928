"""The result models: what goes into summary.json. Every float is plain JSON; None where a value is undefined."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    create_model,
    model_serializer,
    model_validator,
)

from orchestrator.analysis.opmap.bands import Band
from orchestrator.analysis.opmap.measures import MEASURES


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Verdict(StrEnum):
    HELPS = "helps"
    NO_DIFFERENCE = "no_difference"
    HURTS = "hurts"
    INSUFFICIENT_DATA = "insufficient_data"
    # Per-engine goodput where both arms carried every request within its SLOs: the ratio is 1 / engines by
    # construction, so it says nothing about either arm.
    INCONCLUSIVE = "inconclusive"


class Quantiles(_Result):
    p50: float | None
    p90: float | None
    p99: float | None


class RatioCI(_Result):
    """A ratio where > 1 favours the arm, with its bootstrap interval."""

    point: float | None
    low: float | None
    high: float | None
    verdict: Verdict


Measure = Literal["per-token latency", "goodput", "both", "neither"]


class Speedup(_Result):
    baseline: str
    paired: bool  # the same requests in both arms, compared request by request
    pairs: int
    tpot: RatioCI  # baseline per-token latency / the arm's (geometric means)
    goodput: RatioCI  # the arm's goodput / the baseline's (per engine when engines_ratio != 1)
    verdict: Verdict
    decided_by: Measure = "both"  # which ratio's interval decided the verdict
    engines_ratio: float = 1.0  # the arm's engines per baseline engine: 1 on equal hardware
    message: str

    @property
    def deciding(self) -> RatioCI:
        """The ratio whose interval decided the verdict (per-token latency's when both or neither did)."""
        return self.goodput if self.decided_by == "goodput" else self.tpot


class _CellLoad(_Result):
    band: str
    band_index: int
    arm: str
    requests: int
    completed: int
    error_rate: float | None  # not completed (error, timeout, cancelled) / requests
    clock_s: float  # time on the clock the band lasted for this arm
    throughput_rps: float | None  # completed requests per second of that time
    goodput_rps: float | None  # completed within every SLO deadline, per second
    goodput_fraction: float | None  # of the band's requests

    def measure(self, name: str) -> Quantiles:
        """A latency measure's quantiles by its name in orchestrator/analysis/opmap/measures.py."""
        value = getattr(self, name)
        assert isinstance(value, Quantiles), name
        return value


# The latency measures are fields made from the measures table (one row each), between the load's fields and
# the engine's, so that summary.json keeps its key order.
if TYPE_CHECKING:
    _CellMeasures = _CellLoad
else:
    _CellMeasures = create_model(
        "_CellMeasures",
        __base__=_CellLoad,
        **{m.name: (Quantiles, Field(description=m.description)) for m in MEASURES},
    )


class MapCell(_CellMeasures):
    steps: int
    mean_executed_k: float | None  # per engine step the band's requests were in, k = 0 steps included
    acceptance_length: float | None  # 1 + accepted drafts per drafting step
    acceptance_length_by_category: dict[str, float | None]
    speedup: Speedup | None  # None for the baseline arm
    # Batch bands are the baseline twin's (the same requests in every arm's band); requests without a twin are
    # banded by their own batch, counted here.
    own_batch_band: int = 0


class Crossover(_Result):
    arm: str
    band: str | None  # the lowest band where the arm stops helping; None if it helps in every band with data
    band_index: int | None
    message: str


class MapSettings(_Result):
    margin: float = Field(default=0.02, ge=0)  # helps: interval above 1 + margin; hurts: below 1 / (1 + margin)
    confidence: float = Field(default=0.95, gt=0, lt=1)
    bootstrap_samples: int = Field(default=1000, ge=100)
    seed: int = 0
    blocks: int = Field(default=200, ge=2)  # time blocks per run, and at most this many resampled per cell
    min_requests: int = Field(default=20, ge=2)  # per arm and band, for a verdict
    min_paired_share: float = Field(default=0.8, ge=0, le=1)  # pairs / smaller side, to compare pair by pair


class OperatingMap(_Result):
    measure: Literal["batch_size", "offered_rate"]
    unit: str
    bands: list[Band]
    # The primary baseline, chosen by hardware (orchestrator/plan/baselines.py primary_baseline): the batch frame of
    # the per-engine evidence (k_choices); every arm's own is in `baselines`
    baseline: str
    arms: list[str]
    baselines: dict[str, str] = Field(default_factory=dict)  # arm -> the baseline it is compared with
    # arm -> its speculation knobs not at vLLM's defaults, shown under its name; written only where there are some
    knobs: dict[str, str] = Field(default_factory=dict)
    cells: list[MapCell]
    crossovers: list[Crossover]
    unbanded: dict[str, int]  # per arm: requests outside every band (no steps, no offered rate, out of range)
    settings: MapSettings

    @model_serializer(mode="wrap")
    def _knobs_only_where_set(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A run without knobs writes the summary it wrote before the field existed (pydantic>=2.7: no exclude_if).
        data = handler(self)
        if not self.knobs and isinstance(data, dict):
            data.pop("knobs", None)
        return data

    def arm_label(self, arm: str, sep: str = " ") -> str:
        """The arm's name, and its knobs where they are not the defaults."""
        knobs = self.knobs.get(arm)
        return f"{arm}{sep}{knobs}" if knobs else arm

    def is_baseline(self, arm: str) -> bool:
        return self.baselines.get(arm, self.baseline) == arm

    def cell(self, band: str, arm: str) -> MapCell:
        for c in self.cells:
            if c.band == band and c.arm == arm:
                return c
        raise KeyError(f"no cell for band {band!r} and arm {arm!r}")


# Four outcomes: a check with evidence passes or fails; one without evidence is not verifiable (the telemetry
# cannot show it) or not exercised (the load never reached what it checks). Neither of the last two is a pass.
FindingStatus = Literal["pass", "fail", "not_verifiable", "not_exercised"]
UNPROVEN: tuple[FindingStatus, ...] = ("not_verifiable", "not_exercised")  # in the order a summary names them


def _status_of(statuses: list[FindingStatus]) -> FindingStatus:
    """fail when one failed; pass when all passed; else the first unproven outcome present."""
    if "fail" in statuses:
        return "fail"
    return next((u for u in UNPROVEN if u in statuses), "pass")


class Finding(_Result):
    """`passed` is true only for a pass: a finding without evidence (`status` "not_verifiable" or "not_exercised")
    does not pass, and does not fail either; consumers that know only `passed` see it as not passed, never as a
    pass."""

    check: str
    arm: str
    passed: bool
    message: str  # one line, for a person
    band: str | None = None
    status: FindingStatus | None = None  # None: from `passed` (findings written before the status existed)

    @model_validator(mode="after")
    def _status_agrees(self) -> Self:
        if self.status is None:
            object.__setattr__(self, "status", "pass" if self.passed else "fail")
        elif self.passed != (self.status == "pass"):
            raise ValueError(f"finding {self.check}: passed={self.passed} contradicts status {self.status}")
        return self

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    @property
    def verifiable(self) -> bool:
        return self.status != "not_verifiable"

    @property
    def exercised(self) -> bool:
        return self.status != "not_exercised"

    @classmethod
    def not_verifiable(cls, check: str, arm: str, message: str, band: str | None = None) -> Finding:
        return cls(check=check, arm=arm, passed=False, status="not_verifiable", message=message, band=band)

    @classmethod
    def not_exercised(cls, check: str, arm: str, message: str, band: str | None = None) -> Finding:
        return cls(check=check, arm=arm, passed=False, status="not_exercised", message=message, band=band)


class BandKCheck(_Result):
    band: str
    steps: int
    configured_k: list[int]  # the k the arm's policy gives to the band's batch sizes
    executed_k: dict[str, float]  # executed k -> share of the band's steps
    mean_executed_k: float | None
    match_fraction: float | None  # steps whose executed k is the configured k for that step's batch size
    passed: bool


class ArmVerification(_Result):
    arm: str
    kind: str
    topology: str
    steps: int
    match_fraction: float | None
    bands: list[BandKCheck]
    findings: list[Finding]
    passed: bool  # every finding passed

    @property
    def failed(self) -> bool:
        return any(f.failed for f in self.findings)

    @property
    def unverified(self) -> list[Finding]:
        return [f for f in self.findings if not f.verifiable]

    @property
    def unexercised(self) -> list[Finding]:
        return [f for f in self.findings if not f.exercised]

    @property
    def status(self) -> FindingStatus:
        """fail when a check failed; pass when every check passed; else not_verifiable or not_exercised (a check
        lacked evidence)."""
        return _status_of([f.status or "fail" for f in self.findings])


class SwitchTiming(_Result):
    """On a cross_and_recover run: how long after the load crossed the boundary the executed k followed."""

    arm: str
    shape: str
    run: str
    repeat: int
    reference: Literal["shape", "batch"]
    crossed_up_s: float | None  # offsets in the run
    switched_s: float | None
    switch_lag_s: float | None
    crossed_down_s: float | None
    recovered_s: float | None
    recovery_s: float | None
    quiet_k: int | None
    loaded_k: int | None
    bound_s: float
    passed: bool
    message: str
    # "not_exercised": the load never made most of a time bin's steps configure another k, so no switch to time;
    # "not_verifiable": the arm's server shows no step's draft length (an endpoint in SGLang's or TensorRT-LLM's
    # dialect), so no switch can be timed from its telemetry
    status: Literal["pass", "fail", "not_exercised", "not_verifiable"] | None = None  # None: from `passed` (older)

    @model_validator(mode="after")
    def _status_agrees(self) -> Self:
        if self.status is None:
            object.__setattr__(self, "status", "pass" if self.passed else "fail")
        elif self.passed != (self.status == "pass"):
            raise ValueError(f"switch timing {self.arm}: passed={self.passed} contradicts status {self.status}")
        return self


class VerificationReport(_Result):
    arms: list[ArmVerification]
    switch_timings: list[SwitchTiming]
    passed: bool
    # Per dynamic arm, its k-switch cost against the run's step fit (calibrate), or why it has none
    k_switch_costs: list[str] = Field(default_factory=list)

    @property
    def status(self) -> FindingStatus:
        return _status_of([a.status for a in self.arms] + [t.status or "fail" for t in self.switch_timings])
