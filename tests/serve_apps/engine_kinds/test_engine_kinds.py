"""The registry of engine kinds: a kind added by one module validates, runs in virtual time and reports; no
module outside the registry tells engine kinds apart (tests/test_kind_tests.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import pyarrow.compute as pc
import pytest
import yaml
from click.testing import CliRunner

from loadshapes.trace import read_traces
from orchestrator.plan.campaign import Campaign
from serve_apps.engine_kinds.base import EngineConfigBase, EngineKind, Simulation
from serve_apps.engine_kinds.registry import kind_of, kinds, register, unregister
from serve_apps.sim.profile import load_profile

SHIPPED = "llama3.1-8b-h100-eagle"
FLOOR_S = 0.004  # the toy's step floor; the shipped profile's step_overhead is 1.207e-03


# --- the toy kind: one module's worth, registered at test time --------------------------------------------------
class ToyEngineConfig(EngineConfigBase):
    """A simulated engine whose every step pays `step_floor_s` of overhead (its own cost)."""

    kind: Literal["toy"] = "toy"
    profile: str = SHIPPED
    step_floor_s: float = 0.004
    seed: int = 0


class ToyKind(EngineKind):
    name = "toy"
    config = ToyEngineConfig
    runs_in_virtual_time = True

    def simulation(self, config: EngineConfigBase) -> Simulation:
        assert isinstance(config, ToyEngineConfig)
        profile = load_profile(config.profile).model_copy(update={"step_overhead": config.step_floor_s})
        return Simulation(profile=profile, time_scale=1.0, max_model_len=8192, seed=config.seed)

    def served_model_name(self, config: EngineConfigBase) -> str:
        return "toy"


# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def toy() -> Iterator[EngineKind]:
    kind = register(ToyKind())
    try:
        yield kind
    finally:
        unregister("toy")


def campaign_data(engine: dict[str, Any], output: Path) -> dict[str, Any]:
    return {
        "name": "toy-kind",
        "engine": engine,
        "policies": {"off": "off", "fixed3": "fixed:3"},
        "topologies": {"single": "single"},
        "shapes": {"ramp": {"kind": "ramp", "rate_from": 2, "rate_to": 30, "duration_s": 4}},
        "load": {"workers": 1, "drain_s": 20},
        "output": str(output),
    }


def simulate(tmp_path: Path, name: str, engine: dict[str, Any]) -> Path:
    from orchestrator.cli import cli

    path = tmp_path / f"{name}.yaml"
    output = tmp_path / name
    path.write_text(yaml.safe_dump(campaign_data(engine, output)))
    result = CliRunner().invoke(cli, ["simulate", str(path), "--output", str(output)], prog_name="specdrill")
    assert result.exit_code == 0, result.output
    return output


def latencies(run: Path) -> list[tuple[str, float, float]]:
    table = read_traces(f"{run}/traces")
    table = table.take(pc.sort_indices(table, [("request_id", "ascending")]))
    rows = table.select(["request_id", "ttft_s", "e2e_s"]).to_pylist()
    return [(r["request_id"], r["ttft_s"], r["e2e_s"]) for r in rows]


def test_toy_kind_validates_runs_in_virtual_time_and_reports(toy: EngineKind, tmp_path: Path) -> None:
    campaign = Campaign.model_validate(campaign_data({"kind": "toy", "step_floor_s": FLOOR_S}, tmp_path / "x"))
    assert kind_of(campaign.engine) is toy
    assert {arm.served_model_name for arm in campaign.arms()} == {"toy"}

    toy_run = simulate(tmp_path, "toy", {"kind": "toy", "step_floor_s": FLOOR_S})
    # The reference: the simulated kind on a profile file whose step overhead is set by hand to the toy's floor.
    shipped = resources.files("serve_apps").joinpath(f"profiles/{SHIPPED}.yaml").read_text()
    assert "step_overhead: 1.207e-03" in shipped
    floor_profile = tmp_path / "floor.yaml"
    floor_profile.write_text(shipped.replace("step_overhead: 1.207e-03", f"step_overhead: {FLOOR_S}"))
    reference = simulate(tmp_path, "reference", {"kind": "simulated", "profile": str(floor_profile)})
    plain = simulate(tmp_path, "plain", {"kind": "simulated", "profile": SHIPPED})

    ran = latencies(toy_run)
    assert ran and ran == latencies(reference)  # the toy's own cost, step for step
    assert ran != latencies(plain)  # and not the shipped profile's

    summary = json.loads((toy_run / "summary.json").read_text())
    assert summary["mode"] == "virtual"
    assert sorted({u["unit"]["arm"] for u in summary["units"]}) == ["fixed3-single", "off-single"]
    assert all(u["rows"] == u["scheduled"] > 0 for u in summary["units"])
    assert (toy_run / "report.html").exists() or summary["maps"]
    # The report read the campaign back from the run's manifest: the toy's config, validated by its kind.
    stored = json.loads((toy_run / "manifest.json").read_text())["campaign"]
    assert kind_of(Campaign.model_validate(stored).engine) is toy


def test_unknown_kind_names_the_registered_ones(toy: EngineKind, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'simulated', 'vllm', 'endpoint', 'sglang', 'trtllm', 'toy'"):
        Campaign.model_validate(campaign_data({"kind": "maybe"}, tmp_path / "x"))


def test_a_kind_unregistered_is_refused_again(tmp_path: Path) -> None:
    register(ToyKind())
    unregister("toy")
    with pytest.raises(ValueError, match="does not match any of the expected tags"):
        Campaign.model_validate(campaign_data({"kind": "toy"}, tmp_path / "x"))


def test_builtin_kinds_declare_what_the_runners_ask() -> None:
    table = {name: (k.deploys_in_serve, k.runs_in_virtual_time, k.telemetry, k.dialect.name)
             for name, k in kinds().items()}  # fmt: skip
    assert table == {
        "simulated": (True, True, "step_timeline", "vllm"),  # specdrill's servers answer in vLLM's format
        "vllm": (True, False, "step_timeline", "vllm"),
        "endpoint": (False, False, "server_metrics", "vllm"),
        "sglang": (False, False, "server_metrics", "sglang"),
        "trtllm": (False, False, "server_metrics", "trtllm"),
    }


def test_a_campaign_cut_to_some_arms_keeps_only_what_names_them() -> None:
    # Search runs two of a campaign's arms: an endpoint config keeps those arms' URLs, other kinds are unchanged.
    # (That no runner tests a kind by name instead is tests/test_kind_tests.py.)
    from serve_apps.engine_kinds.endpoint import EndpointEngineConfig, as_endpoint

    urls = {"a": "http://a:1", "b": "http://b:1", "c": "http://c:1"}
    endpoint = EndpointEngineConfig(model="m", urls=urls)
    assert as_endpoint(kind_of(endpoint).for_arms(endpoint, {"a", "c"})).urls == {"a": "http://a:1", "c": "http://c:1"}
    simulated = kinds()["simulated"].config.model_validate({"kind": "simulated", "profile": SHIPPED})
    assert kind_of(simulated).for_arms(simulated, {"a"}) is simulated


def test_metrics_dialect_names_what_a_scrape_sums() -> None:
    from orchestrator.execute.endpoint_scrape import parse
    from serve_apps.engine_kinds.dialects.vllm import DIALECT

    text = "\n".join([
        "# HELP vllm:num_requests_running running",
        'ray_vllm:num_requests_running{engine="0"} 3.0',
        'ray_vllm:num_requests_running{engine="1"} 4.0',
        'vllm:num_requests_waiting{engine="0"} 2.0',
        'vllm:spec_decode_num_drafts_total{engine="0"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1"} 5.0',
        "vllm:spec_decode_num_accepted_tokens_total 7.0",
        "sglang:num_running_reqs 99.0",
    ])  # fmt: skip
    sample = parse(text, 5, DIALECT)
    assert (sample.running, sample.waiting, sample.engines) == (7.0, 2.0, 2)
    assert sample.counters == {"num_drafts": 15.0, "draft_tokens": None, "accepted_tokens": 7.0}
    assert sample.draft_length is None  # vLLM exports no gauge of the draft length in force
