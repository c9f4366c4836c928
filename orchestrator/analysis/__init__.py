"""Pure analysis of trace tables: the operating map (which policy helps under which load) and the check that
each arm executed the draft length its policy configures. Functions of pyarrow tables and numpy arrays only."""

from orchestrator.analysis.arms import ArmInfo, PolicyKind
from orchestrator.analysis.bands import Band, BandSet, auto_rate_bands, batch_bands, rate_bands
from orchestrator.analysis.clock import RunKey, offered_rates
from orchestrator.analysis.frame import FRAME_COLUMNS, RequestFrame, request_frame
from orchestrator.analysis.opmap import operating_map, operating_maps
from orchestrator.analysis.reader import read_trace_columns
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
from orchestrator.analysis.slo import SloDeadlines, Slos
from orchestrator.analysis.verify import VERIFY_COLUMNS, VerifySettings, verify_executed_policy

__all__ = [
    "FRAME_COLUMNS",
    "VERIFY_COLUMNS",
    "ArmInfo",
    "ArmVerification",
    "Band",
    "BandKCheck",
    "BandSet",
    "Crossover",
    "Finding",
    "MapCell",
    "MapSettings",
    "OperatingMap",
    "PolicyKind",
    "Quantiles",
    "RatioCI",
    "RequestFrame",
    "RunKey",
    "SloDeadlines",
    "Slos",
    "Speedup",
    "SwitchTiming",
    "Verdict",
    "VerificationReport",
    "VerifySettings",
    "auto_rate_bands",
    "batch_bands",
    "offered_rates",
    "operating_map",
    "operating_maps",
    "rate_bands",
    "read_trace_columns",
    "request_frame",
    "verify_executed_policy",
]
