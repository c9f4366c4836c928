"""Every campaign that validates produces a report: VALID campaigns generated at random (policies, several `off`
arms, topologies, every shape kind, SLOs, repeats, mixes, gates) run end to end in virtual time, through the
report and the recommendation, and never end in a traceback."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from rich.console import Console

from loadshapes.shapes import Concurrency
from orchestrator.plan.campaign import Campaign, CampaignError, load_campaign
from orchestrator.plan.size import mix_tokens, shape_requests
from serve_apps.config_io import load_yaml_model
from serve_apps.sim.profile import load_profile

# Short runs: each example is a whole campaign (simulate, report, recommend); CI runs this many.
EXAMPLES = int(os.environ.get("SPECDRILL_FUZZ_EXAMPLES", "12"))
WORKLOADS = ["chat", "reasoning", "editing", "code"]


@st.composite
def schedules(draw: st.DrawFn, max_k: int) -> str:
    """A valid short-form schedule: starts at 1, sorted, no overlap, gaps allowed, k in 0..max_k."""
    starts = sorted(draw(st.sets(st.integers(2, 300), max_size=3)))
    entries, begin = [], 1
    for start in [*starts, 512]:
        end = draw(st.integers(begin, start - 1)) if start > begin else begin
        entries.append(f"{begin}-{end}={draw(st.integers(0, max_k))}")
        begin = start
        if begin > 512:
            break
    return ",".join(entries)


@st.composite
def shapes(draw: st.DrawFn, csv_path: Path) -> dict[str, Any]:
    rate = st.floats(0.5, 30)
    short = st.floats(0.5, 3)
    kind = draw(
        st.sampled_from(["quiet", "ramp", "sustained", "step", "cross_and_recover", "day", "concurrency", "replay"])
    )
    if kind in ("quiet", "sustained"):
        return {"kind": kind, "rate": draw(rate), "duration_s": draw(short)}
    if kind == "ramp":
        return {"kind": kind, "rate_from": draw(st.floats(0, 30)), "rate_to": draw(rate), "duration_s": draw(short)}
    if kind == "step":
        return {"kind": kind, "rates": draw(st.lists(rate, min_size=1, max_size=3)), "step_s": draw(short)}
    if kind == "cross_and_recover":
        quiet, boundary, peak = sorted(draw(st.lists(rate, min_size=3, max_size=3, unique=True)))
        return {
            "kind": kind, "quiet_rate": quiet, "boundary_rate": boundary, "peak_rate": peak, "boundary": "bs8",
            "quiet_s": draw(short), "rise_s": draw(short), "hold_s": draw(short), "fall_s": draw(short),
        }  # fmt: skip
    if kind == "day":
        return {"kind": kind, "min_rate": draw(st.floats(0, 5)), "max_rate": draw(rate), "duration_s": draw(short),
                "segments": draw(st.integers(4, 12))}  # fmt: skip
    if kind == "concurrency":
        return {"kind": kind, "users": draw(st.integers(1, 6)), "duration_s": draw(short)}
    return {"kind": "replay", "path": str(csv_path), "speed": draw(st.floats(0.5, 4)), "bin_s": 0.5}


@st.composite
def campaigns(draw: st.DrawFn, csv_path: Path, output: Path) -> dict[str, Any]:
    policies: dict[str, Any] = {"off": "off"}
    for i in range(draw(st.integers(0, 2))):
        policies[f"fixed{i}"] = f"fixed:{draw(st.integers(1, 5))}"
    for i in range(draw(st.integers(0, 2))):
        max_k = draw(st.integers(1, 4))
        policies[f"dyn{i}"] = f"dynamic:{max_k}:{draw(schedules(max_k))}"
    topologies = draw(
        st.dictionaries(
            st.sampled_from(["single", "r2", "dp2", "dp3", "tp2"]), st.just(None), min_size=1, max_size=3
        )
    )
    forms = {"single": "single", "r2": "replicas:2", "dp2": "data_parallel:2", "dp3": "data_parallel:3",
             "tp2": {"kind": "single", "tensor_parallel_size": 2}}  # fmt: skip
    data: dict[str, Any] = {
        "name": "fuzz",
        "engine": {"kind": "simulated", "profile": draw(st.sampled_from(["llama3.1-8b-h100-eagle",
                                                                          "llama3.1-8b-h100-ngram"]))},
        "policies": policies,
        "topologies": {name: forms[name] for name in topologies},
        "shapes": {f"s{i}": draw(shapes(csv_path)) for i in range(draw(st.integers(1, 3)))},
        "mix": {"entries": [{"workload": w, "weight": draw(st.floats(0.1, 5))}
                            for w in draw(st.lists(st.sampled_from(WORKLOADS), min_size=1, max_size=3, unique=True))]},
        "repeats": draw(st.integers(1, 2)),
        "seed": draw(st.integers(0, 2**16)),
        "output": str(output),
        "load": {"workers": draw(st.integers(1, 3)), "process": draw(st.sampled_from(["poisson", "gamma", "constant"])),
                 "cv": draw(st.floats(0.3, 3)), "drain_s": draw(st.floats(1, 30))},
        "gates": {"dynamic_follows_schedule": draw(st.booleans()), "fail_on_schedule_dropped": draw(st.booleans()),
                  "max_recovery_s": draw(st.one_of(st.none(), st.floats(0.1, 10)))},
    }  # fmt: skip
    slo = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "ttft_s": st.one_of(st.none(), st.floats(0.05, 5)),
                "tpot_s": st.one_of(st.none(), st.floats(0.002, 0.2)),
                "e2e_s": st.one_of(st.none(), st.floats(0.5, 60)),
                "per_category": st.dictionaries(
                    st.sampled_from(WORKLOADS), st.fixed_dictionaries({}, optional={"e2e_s": st.floats(0.5, 60)}),
                    max_size=2,
                ),
            },
        )
    )
    if slo:
        data["slo"] = slo
    if draw(st.booleans()) and len(policies) > 1:
        # A subset of the arms: always `off` on one engine (every other arm has a baseline, per engine if need be),
        # sometimes `off` on other topologies too (several `off` arms).
        arms = [{"policy": "off", "topology": next(iter(data["topologies"]))}]
        pairs = [(p, t) for p in policies for t in data["topologies"]]
        arms += [{"policy": p, "topology": t} for p, t in draw(st.lists(st.sampled_from(pairs), min_size=1,
                                                                          max_size=4, unique=True))]  # fmt: skip
        data["arms"] = [dict(t) for t in {tuple(sorted(a.items())) for a in arms}]
    return data


def test_every_valid_campaign_runs_to_a_report(tmp_path: Path) -> None:
    from orchestrator.analysis.read.inputs import load_run
    from orchestrator.analysis.summary import build_summary
    from orchestrator.decide.recommend.build import recommend
    from orchestrator.report.build import write_report
    from orchestrator.rundir.manifest import units_of
    from orchestrator.virtual.campaign import simulate_campaign

    csv_path = tmp_path / "arrivals.csv"
    csv_path.write_text("\n".join(f"{t:.3f}" for t in (0, 0.1, 0.15, 0.2, 0.9, 1.0, 1.05, 1.6, 2.2, 2.25)))
    counter = iter(range(10**6))

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        output = tmp_path / f"run{next(counter)}"
        spec = data.draw(campaigns(csv_path, output))
        path = output.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        try:
            campaign = load_campaign(path)
            campaign.require_traffic()
        except CampaignError:
            assume(False)  # refused in one line before anything runs: the validator's fuzz test covers those
            raise
        store, _ = simulate_campaign(campaign, output=str(output))
        with redirect_stdout(io.StringIO()):
            summary = write_report(store.root, console=Console(file=io.StringIO(), width=200))
        assert (output / "report.html").stat().st_size > 0 and (output / "summary.json").exists()
        expected = {u.key for arm in campaign.arms() for u in units_of(campaign, arm)}
        assert {result.unit.key for result in summary.units} == expected
        assert all(result.rows == result.scheduled for result in summary.units)
        # The plan's closed-loop figure (what the limits are checked against) bounds what was sent: every user's
        # requests one after another, each at least its steps at the profile's fastest step (one in flight at
        # the end besides)
        profile = load_profile(spec["engine"]["profile"])
        max_k = max(a.policy.resolve(a.topology).num_speculative_tokens for a in campaign.arms())
        for result in summary.units:
            shape = campaign.shapes[result.unit.shape]
            if isinstance(shape, Concurrency):
                bound = shape_requests(shape, mix_tokens(campaign.mix), profile, max_k, 8192)
                assert result.scheduled <= bound + shape.users, (result.unit.key, result.scheduled, bound)
        inputs = load_run(store.root)
        recommendation, rehearsal, followup = recommend(build_summary(inputs)[0], inputs.campaign, store.root)
        assert recommendation.message
        # nothing to rehearse only where no schedule was recommended
        assert (rehearsal is None) == (recommendation.speculative_config is None)
        if rehearsal is not None:
            load_yaml_model(yaml.safe_dump(rehearsal), Campaign, origin="rehearsal", error=CampaignError)
        if followup is not None:
            load_yaml_model(yaml.safe_dump(followup), Campaign, origin="follow-up", error=CampaignError)

    run()
