"""What `specdrill recommend` decides, as it is written to recommendation.json: per batch band the candidates
compared and the k chosen, and the schedule built from them (recommend.py decides; recommend_campaigns.py builds
the campaigns that rehearse it and measure what is missing)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.analysis.results import RatioCI

Confidence = Literal["high", "medium", "low", "none"]
Status = Literal["schedule", "off", "insufficient"]
# Why the schedule runs its k in a band: measured there; `off` measured faster (a schedule cannot unload the
# drafter, so it runs k = 0); or no evidence, inherited from a neighbour.
Basis = Literal["measured", "off_faster", "inherited"]


class Candidate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    run: str
    arm: str
    k: int
    speculative: bool  # False: the `off` arm
    requests: int
    vs_best: RatioCI | None  # per-token latency over the band's fastest speculative arm's; None: the fastest
    through_off: bool  # measured in another run than the fastest: compared through each run's `off` arm

    @property
    def name(self) -> str:
        return "off" if not self.speculative else f"k={self.k}"


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
    candidates: list[Candidate]
    unmeasured_k: list[int]
    more_repeats: int | None  # the repeats that would give this band its needed requests; None: more will not
    confidence: Confidence
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
