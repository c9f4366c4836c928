"""Pure analysis of traces on DuckDB: the operating map (which policy helps under which load) and the check that
each arm executed the draft length its policy configures. DuckDB reads and groups the rows; numpy only sees
the small aggregates it returns."""

from orchestrator.analysis.arms import ArmInfo, PolicyKind
from orchestrator.analysis.bands import Band, BandSet, auto_rate_bands, batch_bands, rate_bands, rate_bands_at
from orchestrator.analysis.db import EngineSettings
from orchestrator.analysis.opmap import operating_map, operating_maps
from orchestrator.analysis.results import (
    ArmVerification,
    BandKCheck,
    Crossover,
    Finding,
    MapCell,
    MapSettings,
    OperatingMap,
    Quantiles,
    RatioCI,
    Speedup,
    SwitchTiming,
    Verdict,
    VerificationReport,
)
from orchestrator.analysis.run_views import run_requests
from orchestrator.analysis.source import Requests, RunKey, request_frame
from orchestrator.analysis.verify import verify_executed_policy
from orchestrator.analysis.verify_settings import VerifySettings

__all__ = [
    "ArmInfo",
    "ArmVerification",
    "Band",
    "BandKCheck",
    "BandSet",
    "Crossover",
    "EngineSettings",
    "Finding",
    "MapCell",
    "MapSettings",
    "OperatingMap",
    "PolicyKind",
    "Quantiles",
    "RatioCI",
    "Requests",
    "RunKey",
    "Speedup",
    "SwitchTiming",
    "Verdict",
    "VerificationReport",
    "VerifySettings",
    "auto_rate_bands",
    "batch_bands",
    "operating_map",
    "operating_maps",
    "rate_bands",
    "rate_bands_at",
    "request_frame",
    "run_requests",
    "verify_executed_policy",
]
