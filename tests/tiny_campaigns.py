"""Small simulated campaigns, and the CLI called in-process, shared by the tests that need a finished virtual run
in seconds. Build a test's campaign here instead of writing its own copy: the base is one simulated engine (the
eagle profile) and the tests' common policies; what a test varies goes in as top-level keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import pytest
import yaml

from orchestrator.cli import main

EAGLE: Final[Mapping[str, str]] = {"kind": "simulated", "profile": "llama3.1-8b-h100-eagle"}
# Speculates at small batches, less at middling ones, not at all from 13 on: a ramp to 8-30 req/s crosses it.
DYN: Final = "dynamic:3:1-4=3,5-12=1,13-512=0"


def sim_campaign(name: str, **changes: Any) -> dict[str, Any]:
    """`off` against DYN on one single-engine topology; `changes` replace (or add) top-level keys. A fresh dict
    each call: tests change theirs."""
    data: dict[str, Any] = {
        "name": name, "engine": dict(EAGLE), "policies": {"off": "off", "dyn": DYN}, "topologies": {"single": "single"},
    }  # fmt: skip
    data.update(changes)
    return data


def four_arms(name: str, **changes: Any) -> dict[str, Any]:
    """off, fixed3 and dyn on one engine, and dyn on two data-parallel engines (the quickstart's arms)."""
    arms = [("off", "single"), ("fixed3", "single"), ("dyn", "single"), ("dyn", "dp2")]
    return sim_campaign(name, **{
        "policies": {"off": "off", "fixed3": "fixed:3", "dyn": DYN},
        "topologies": {"single": "single", "dp2": "data_parallel:2"},
        "arms": [{"policy": policy, "topology": topology} for policy, topology in arms],
        **changes,
    })  # fmt: skip


def as_yaml(data: Mapping[str, Any]) -> str:
    # In the dict's order: units run in the order policies and shapes are written.
    return yaml.safe_dump(dict(data), sort_keys=False)


def two_shapes(name: str, **shapes: dict[str, Any]) -> str:
    """Two units per arm (a ramp and a quiet hold), `off` against DYN on one engine: ~200 requests. A shape named
    in `shapes` is replaced in its place."""
    ramp = {"kind": "ramp", "rate_from": 1, "rate_to": 8, "duration_s": 6}
    calm = {"kind": "quiet", "rate": 2, "duration_s": 4}
    return as_yaml(sim_campaign(name, shapes={"ramp": ramp, "calm": calm, **shapes}, load={"drain_s": 5}))


def cli_exit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`specdrill ARGS` in this process: its exit code and what it wrote to stderr."""
    with pytest.raises(SystemExit) as caught:
        main(list(args))
        raise SystemExit(0)
    code = caught.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err
