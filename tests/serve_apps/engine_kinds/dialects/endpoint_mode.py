"""One endpoint unit the way `specdrill run` runs it, without Ray: the plan plans_for builds from the campaign (its
kind's dialect copied in), the real load worker (Locust in a child process), the /metrics sampler around it, the
samples file, and the verifier in the kind's dialect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadshapes.trace import read_traces
from orchestrator.analysis.opmap.results import VerificationReport
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.verify.executed import verify_executed_policy
from orchestrator.execute.endpoint_scrape import MetricsSampler
from orchestrator.execute.load_workers import LocustProcess
from orchestrator.plan.campaign import Campaign
from orchestrator.rundir.endpoint_samples import read_samples, write_samples
from orchestrator.rundir.layout import Unit
from orchestrator.rundir.manifest import plans_for
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.policies import DynamicPolicy, FixedPolicy
from timebase.clock import now_ns


def endpoint_unit(
    kind: str, url: str, root: Path, *, policy: str = "fixed:3", rate: float = 8, shape: dict[str, Any] | None = None
) -> VerificationReport:
    """`shape`: the unit's load shape (default: `rate` req/s for 3 s)."""
    data: dict[str, Any] = {
        "name": f"dialect-{kind}",
        "engine": {"kind": kind, "model": "m", "urls": {"spec-single": url}},
        "policies": {"spec": policy}, "topologies": {"single": "single"},
        "shapes": {"calm": shape or {"kind": "quiet", "rate": rate, "duration_s": 3}},
        "mix": {"entries": [{"workload": "chat", "weight": 1}]}, "warmup": {"requests": 0},
        "load": {"workers": 1, "drain_s": 10}, "analysis": {"absolute_only": True}, "output": str(root / "unused"),
    }  # fmt: skip
    campaign = Campaign.model_validate(data)
    (arm,) = campaign.arms()
    unit = Unit(arm=arm.name, shape="calm", repeat=0)
    (plan,) = plans_for(campaign, arm, unit, run="r1", url=url, traces=str(root / "traces"))
    dialect = kind_of(campaign.engine).dialect
    process = LocustProcess(plan, str(root / "work"))
    with MetricsSampler(url, {}, dialect, interval_s=0.2) as sampler:
        process.start()
        try:
            process.wait_ready(60)
            process.go(now_ns() + 500_000_000)
            process.wait(60)
        finally:
            process.stop()
    write_samples(str(root), unit.arm, unit.shape, unit.repeat, sampler.table())
    samples = read_samples(str(root), [(unit.arm, unit.shape, unit.repeat)])
    assert isinstance(arm.policy, FixedPolicy | DynamicPolicy)
    info = ArmInfo.from_policy(arm.name, arm.policy, topology=arm.topology, max_num_seqs=512)
    return verify_executed_policy(
        read_traces(str(root / "traces")), [info], shapes=campaign.shapes, endpoint_samples=samples, dialect=dialect
    )
