"""What `specdrill recommend` decides, as it is written to recommendation.json: per batch band the candidates
compared and the k chosen, and the schedule built from them (recommend.py decides; recommend_campaigns.py builds
the campaigns that rehearse it and measure what is missing)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.opmap.results import RatioCI

Confidence = Literal["high", "medium", "low", "none"]
Status = Literal["schedule", "off", "insufficient"]
# Why the schedule runs its k in a band: measured there; `off` measured faster (a schedule cannot unload the
# drafter, so it runs k = 0); or no evidence, inherited from a neighbour.
Basis = Literal["measured", "off_faster", "inherited"]
# Where a band's evidence is: the whole band; a part of a report band the evidence separated (split); the part of a
# band above (or below) the batch the `off` arm's requests reached (beyond_measured: no evidence, inherited).
Extent = Literal["band", "split", "beyond_measured"]


class Candidate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    run: str
    arm: str
    k: int
    speculative: bool  # False: the `off` arm
    requests: int
    vs_best: RatioCI | None  # per-token latency over the band's fastest speculative arm's; None: the fastest
    through_off: bool  # measured in another run than the fastest: compared through each run's `off` arm
    # Another engine's design (SGLang's, TensorRT-LLM's): compared like any arm, never a k of vLLM's schedule
    design: str | None = None

    @property
    def name(self) -> str:
        return "off" if not self.speculative else self.design or f"k={self.k}"

    @property
    def vllm_k(self) -> bool:
        """A k that vLLM's schedule can run (a speculative arm of vLLM's policies)."""
        return self.speculative and self.design is None


class BandDecision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    band: str
    low: int
    high: int
    requests: int  # n: the `off` arm's requests here (the most of any run)
    needed: int  # per candidate, for a verdict
    status: Status
    k: int | None  # the smallest k within the margin of the fastest speculative arm; None: no evidence
    arm: str | None  # the arm that measured k (or `off` where status is off)
    schedule_k: int | None = None  # what the recommended schedule runs here; None: no schedule
    basis: Basis | None = None
    inherited_from: str | None = None
    # The batch sizes the evidence covers: the `off` arm's requests' typical batch in the band (None: none ran
    # here); of_band: the report's band the decision was made in (a split or a part beyond the measured load)
    measured_low: int | None = None
    measured_high: int | None = None
    of_band: str | None = None
    extent: Extent = "band"
    candidates: list[Candidate]
    unmeasured_k: list[int]
    more_repeats: int | None  # the repeats that would give this band its needed requests; None: more will not
    confidence: Confidence
    message: str


class DataParallelAnswer(BaseModel):
    """The answer for a data-parallel deployment: vLLM drops a schedule there and runs num_speculative_tokens in
    every step, so the choice is one static k at the measured load (recommend_topology.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topology: str  # data_parallel:N
    status: Literal["static", "off", "insufficient"]
    k: int | None  # the static k (0 with status off)
    arm: str | None  # the arm that measured it
    # per candidate ("off", "k=1", ...): its per-token latency over the fastest's at the measured load, weighted by
    # the requests per band of the load the deployment saw (1: the fastest)
    scores: dict[str, float]
    weighted_by: str  # whose requests per band weight the bands
    schedule_gain: float | None  # the recommended schedule's per-token speedup over the static k at that load
    speculative_config: dict[str, Any] | None
    message: str


class Recommendation(BaseModel):
    model_config = ConfigDict(frozen=True)
    runs: list[str]
    mode: str
    status: Status  # schedule: speculative_config below; off: leave speculation off; insufficient: nothing
    off_arm: str | None
    method: str
    model: str | None
    num_speculative_tokens: int
    schedule: list[list[int]]  # vLLM's num_speculative_tokens_per_batch_size
    bands: list[BandDecision]
    not_measured: list[str]  # bands where some k in 0..max_k was never measured, or too few requests were
    speculative_config: dict[str, Any] | None  # None: no schedule recommended (see status)
    frame: str  # whose batch sizes the edges are
    message: str
    data_parallel: DataParallelAnswer | None = None  # where the runs have data-parallel arms, or asked for
    # The schedule read per workload category: where its k is slower than off for one (recommend/categories.py)
    category_checks: list[str] = []
