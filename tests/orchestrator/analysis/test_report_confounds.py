"""What the report states about confounds between arms that the arms' telemetry reveals."""

from __future__ import annotations

from typing import Any

from orchestrator.analysis.headline import engine_confounds


def _arm(kind: str, mode: str | None, runner: str | None, async_scheduling: bool | None = None) -> dict[str, Any]:
    return {
        "policy": {"kind": kind},
        "cudagraph_mode": mode,
        "model_runner": runner,
        "async_scheduling": async_scheduling,
    }


def test_model_runner_v1_forcing_piecewise_on_a_dynamic_schedule_is_stated_with_its_cause() -> None:
    manifest = {
        "arms": {
            "fixed3-single": _arm("fixed", "FULL_AND_PIECEWISE", "V1"),
            "dyn-single": _arm("dynamic", "PIECEWISE", "V1"),
            "off-single": _arm("off", "FULL_AND_PIECEWISE", "V1"),
            "sim-arm": _arm("fixed", None, None),  # a simulated engine has none: not a difference
        }
    }
    (line,) = engine_confounds(manifest)
    assert line == (
        "CUDA graph modes differ between arms (dyn-single PIECEWISE, fixed3-single FULL_AND_PIECEWISE, off-single "
        "FULL_AND_PIECEWISE): part of their difference is the graph mode, not k (model runner V1 forces "
        "PIECEWISE for a dynamic schedule: dyn-single)"
    )


def test_model_runner_v2_keeps_full_graphs_for_a_dynamic_schedule_so_nothing_is_said() -> None:
    manifest = {
        "arms": {
            "fixed3-single": _arm("fixed", "FULL_AND_PIECEWISE", "V2", True),
            "dyn-single": _arm("dynamic", "FULL_AND_PIECEWISE", "V2", True),
        }
    }
    assert engine_confounds(manifest) == []
    # Modes that differ on V2 are still a confound, but V1's override is not its cause: no cause is named.
    manifest["arms"]["dyn-single"] = _arm("dynamic", "PIECEWISE", "V2", True)
    (line,) = engine_confounds(manifest)
    assert "part of their difference is the graph mode, not k" in line and "V1" not in line


def test_runners_and_async_scheduling_that_differ_are_stated() -> None:
    manifest = {
        "arms": {
            "eagle-single": _arm("fixed", "FULL_AND_PIECEWISE", "V2", True),
            "ngram-single": _arm("dynamic", "PIECEWISE", "V1", False),  # n-gram turns async scheduling off
        }
    }
    graphs, runners, scheduling = engine_confounds(manifest)
    assert "(model runner V1 forces PIECEWISE for a dynamic schedule: ngram-single)" in graphs
    assert runners == (
        "model runners differ between arms (eagle-single V2, ngram-single V1): part of their difference is the "
        "model runner, not k"
    )
    assert scheduling == (
        "async scheduling differs between arms (eagle-single on, ngram-single off): part of their difference is "
        "the scheduling, not k"
    )
    same = {"arms": {"a": _arm("off", "NONE", "V1", False), "b": _arm("off", "NONE", "V1", False), "c": {}}}
    assert engine_confounds(same) == [] and engine_confounds({}) == []


def test_on_model_runner_v2_differing_graph_modes_are_stated_without_a_cause_that_is_not_true() -> None:
    # V2 keeps full graphs for a dynamic schedule (vllm/config/vllm.py _maybe_override_dynamic_sd_cudagraph_mode
    # returns for use_v2_model_runner): a PIECEWISE arm there came from elsewhere (e.g. its engine_kwargs).
    manifest = {
        "arms": {
            "dyn-single": _arm("dynamic", "PIECEWISE", "V2", True),
            "off-single": _arm("off", "FULL_AND_PIECEWISE", "V2", True),
        }
    }
    assert engine_confounds(manifest) == [
        "CUDA graph modes differ between arms (dyn-single PIECEWISE, off-single FULL_AND_PIECEWISE): part of their "
        "difference is the graph mode, not k"
    ]
    # A V1 arm on PIECEWISE with a fixed k: not the dynamic-schedule override either.
    manifest["arms"]["dyn-single"] = _arm("fixed", "PIECEWISE", "V1", True)
    manifest["arms"]["off-single"] = _arm("off", "FULL_AND_PIECEWISE", "V1", True)
    (line,) = engine_confounds(manifest)
    assert line.endswith("part of their difference is the graph mode, not k")
