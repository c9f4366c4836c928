"""What the report states about confounds between arms that the arms' telemetry reveals."""

from __future__ import annotations

from orchestrator.report import graph_mode_confound


def test_different_cuda_graph_modes_between_arms_are_stated() -> None:
    manifest = {
        "arms": {
            "fixed3-single": {"cudagraph_mode": "FULL_AND_PIECEWISE"},
            "dyn-single": {"cudagraph_mode": "PIECEWISE"},
            "off-single": {"cudagraph_mode": "FULL_AND_PIECEWISE"},
            "sim-arm": {"cudagraph_mode": None},  # a simulated engine has none: not a difference
        }
    }
    line = graph_mode_confound(manifest)
    assert line is not None and "dyn-single PIECEWISE" in line and "fixed3-single FULL_AND_PIECEWISE" in line
    assert "sim-arm" not in line and "not k" in line
    same = {"arms": {"a": {"cudagraph_mode": "NONE"}, "b": {"cudagraph_mode": "NONE"}, "c": {}}}
    assert graph_mode_confound(same) is None and graph_mode_confound({}) is None
