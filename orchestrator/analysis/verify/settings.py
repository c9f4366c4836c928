"""The thresholds and resolutions the executed-policy verification judges by."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class VerifySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min_match_fraction: float = Field(default=0.99, ge=0, le=1)  # steps whose executed k is the configured k
    fallback_share: float = Field(default=0.9, gt=0, le=1)  # of steps configured below max k that ran max k
    min_steps: int = Field(default=20, ge=1)  # fewer steps in a check's scope: not exercised
    bin_s: float = Field(default=1.0, gt=0)  # time resolution of switch timing
    switch_bound_s: float = Field(default=10.0, gt=0)
    reference: Literal["shape", "batch"] = "shape"
