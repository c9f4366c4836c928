"""The campaign file: what to deploy (engine, policies, topologies), the traffic (shapes, request mix, load
workers), what counts as good (SLOs), what must hold (gates), and where the run goes (output).

Strict: an unknown key is an error naming it and its path.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from loadshapes.campaign_files import FILES_RELATIVE_TO, RECORDED, reads_files
from loadshapes.mixes import MixEntry, RequestMix
from loadshapes.shapes import Replay, Shape, Sustained
from loadshapes.slo import SloConfig
from orchestrator.plan.arms import CampaignArms, build_arms, engine_max_num_seqs
from orchestrator.plan.baselines import BaselineError, baselines
from orchestrator.plan.datasets import DatasetRefused, dataset_lines
from orchestrator.plan.generated_text import generated_text_lines
from orchestrator.plan.plausible import slo_warnings
from orchestrator.plan.size import PlanSize, planned_size, refusal
from serve_apps.arms import ArmSpec, EngineConfig
from serve_apps.config_io import derived, load_yaml_model, read_text
from serve_apps.engine_kinds.registry import bind_engine_field, kind_of
from serve_apps.policies import Topology, parse_topology
from serve_apps.resources import Resources
from serve_apps.sim.profile import Profile

ARMS = "_arms"  # where a Campaign keeps its CampaignArms (config_io.derived)
DATASET_LINES = "_dataset_lines"  # where it keeps its data sets' lines


class CampaignError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServeConfig(_Strict):
    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="Ray Serve's HTTP host; loopback unless you open it (docs/operator/security.md)",
    )
    port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="Ray Serve's HTTP port; a campaign asking for another port than Serve's running one is refused",
    )


def _topology(value: Any) -> Any:
    """The short form (parse_topology) or a mapping {kind, size, tensor_parallel_size}."""
    if isinstance(value, str):
        try:
            return parse_topology(value)
        except ValueError as exc:
            raise ValueError(f"{exc} or a mapping") from None
    return value


class ArmSelection(_Strict):
    policy: str = Field(description="a name under `policies`")
    topology: str = Field(description="a name under `topologies`")


class LoadConfig(_Strict):
    """The load workers: how many (Ray actors spread over the nodes), how they send, when a run is invalid."""

    workers: int = Field(
        default=1,
        ge=1,
        le=256,
        description="load workers (Ray actors, spread over the nodes); the traffic is the same for any number",
    )
    cpus_per_worker: float = Field(default=0.5, gt=0, description="CPUs each worker actor reserves")
    process: Literal["poisson", "gamma", "constant"] = Field(
        default="poisson",
        description="arrivals: inhomogeneous Poisson, gamma (burstiness `cv`) or even gaps, at the shape's rate",
    )
    cv: float = Field(default=1.0, gt=0)  # burstiness of gamma arrivals
    endpoint: Literal["completions", "chat"] = Field(
        default="completions", description="`/v1/completions` or `/v1/chat/completions`, streamed"
    )
    lateness_bound_s: float = Field(
        default=0.005,
        gt=0,
        description="a worker whose p99 send lateness exceeds this makes its unit generator-saturated",
    )
    # The simulated engine in real time: a unit where the engine's lag (step tokens handed out late) adds more
    # than this share to the model's step time is flagged like a saturated generator: its latencies are the
    # host's. 0.1: the engine ran within 10% of its model's pace, five times the verdicts' 2% margin, so a
    # verdict is only at risk where the arms were slowed very unequally; beyond it they measurably were
    # (docs/operator/simulator.md).
    engine_lag_bound: float = Field(default=0.1, gt=0)
    drain_s: float = Field(
        default=120.0,
        ge=0,
        description="after the last send, requests still in flight this long are cancelled (`drain_timeout`)",
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="a request running longer becomes a `timeout` row"
    )
    max_in_flight: int = Field(
        default=4096,
        ge=1,
        description="connections per worker; a request that finds none free waits and saturates the unit",
    )
    store_token_times: bool = Field(default=True, description="keep every token's arrival time (`token_times_ns`)")
    # Per-step lists in every trace row (the step summaries are always there). Off: the engine step timeline
    # has each step once, the lists repeat it for every request in the batch. Endpoint arms keep them anyway.
    store_step_lists: bool = False
    # "fresh": each repeat draws its own arrivals and requests (repeats sample the traffic as well as the
    # engine); "same": every repeat replays repeat 0's traffic, so two repeats differ only by the host and the
    # engine (a noise floor: how far two runs of the very same traffic differ on this host).
    repeat_traffic: Literal["fresh", "same"] = "fresh"
    # Trace part files: a worker writes one every flush_rows rows or flush_s seconds (and at stop), so a fault
    # loses at most that much of what was measured.
    flush_rows: int = Field(default=1000, ge=1)
    flush_s: float = Field(default=5.0, gt=0, description="see flush_rows")
    ready_timeout_s: float = Field(
        default=300.0, gt=0, description="how long a worker may take to build its schedule and request bodies"
    )


class WarmupConfig(_Strict):
    requests: int = Field(default=4, ge=0)  # sent to each arm after deploy, before any measured unit; 0: none


class GateConfig(_Strict):
    """What makes `specdrill run` / `report` exit non-zero."""

    # a load-dependent arm (vLLM's schedule, SGLang's adaptive steps, TensorRT-LLM's schedule, cap or gate) whose
    # executed k does not follow its schedule or rule fails
    dynamic_follows_schedule: bool = True
    baseline_is_off: bool = True  # an `off` arm that speculated fails: every speedup against it is void
    min_follow_fraction: float = Field(
        default=0.9, gt=0, le=1, description="share of steps whose executed k must equal the configured k"
    )
    fail_on_schedule_dropped: bool = Field(
        default=False, description="an arm whose engine dropped its schedule fails (exempt arms excepted)"
    )
    fail_on_saturated_generator: bool = Field(default=False, description="a load-generator-saturated unit fails")
    fail_on_engine_lag: bool = False  # a unit whose simulated engine lagged (load.engine_lag_bound) fails
    max_recovery_s: float | None = Field(default=None, gt=0)  # cross_and_recover: k must switch within this
    exempt_arms: list[str] = Field(default_factory=list)  # reported, never failing (e.g. a known DP fallback)
    # A check without evidence (e.g. a foreign server that reports no config): "report" lists it, "fail" fails
    not_verifiable: Literal["report", "fail"] = "report"


class AnalysisConfig(_Strict):
    """How the report cuts the traces; not part of what makes two runs comparable."""

    # Offered-rate band edges in req/s, increasing: bands [e0, e1), [e1, e2), ... and an open one above the last.
    # None: edges at quantiles of the rates offered (equal request counts per band).
    rate_bands: list[float] | None = Field(default=None, min_length=2)
    # A campaign without an `off` arm (e.g. one foreign server with speculation): absolute figures only, no
    # speedups, and every report says so. Without it such a campaign is refused, having nothing to compare with.
    absolute_only: bool = False

    @field_validator("rate_bands")
    @classmethod
    def _increasing(cls, v: list[float] | None) -> list[float] | None:
        if v is not None:
            if v[0] < 0:
                raise ValueError(f"rate band edges are rates: {v[0]:g} is below 0")
            for low, high in itertools.pairwise(v):
                if not low < high:
                    raise ValueError(f"rate band edges must increase: {low:g} then {high:g}")
        return v


def _default_mix() -> RequestMix:
    return RequestMix(entries=[MixEntry(workload="chat", weight=1.0)])


class Campaign(_Strict):
    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]{0,40}$",
        description="slug; arms are served at `/<name>/<arm>` and named `<policy>-<topology>`",
    )
    engine: EngineConfig
    policies: dict[str, Any] = Field(
        min_length=1,
        description=(
            'name -> policy: the short form (`"off"`, `"fixed:3"`, `"fixed:ngram:4"`, '
            '`"dynamic:3:1-64=3,65-128=1"`; method and drafter default to the simulated profile\'s, n-gram '
            "otherwise) or a mapping in vLLM's terms (OffPolicy, FixedPolicy, DynamicPolicy); the other engines' "
            'designs, simulated: `"sglang_adaptive:3"` (SGLang\'s shipped slots), '
            '`"trtllm_schedule:upper_bounds:4:4=4,8=2,32=1"` (or `lower_bounds`), `"trtllm_max_concurrency:3:32"`, '
            '`"trtllm_acceptance_gate:3:50:0.3"` (TensorRT-LLM\'s take a last `:floor0_fault`), or a mapping in '
            'their terms (SglangAdaptivePolicy, TrtllmSchedulePolicy, ...); quote `"off"`: YAML reads off as false'
        ),
    )
    topologies: dict[str, Annotated[Topology, Field()]] = Field(
        default_factory=lambda: {"single": Topology()},
        description="name -> `single`, `replicas:N`, `data_parallel:N`, or a Topology mapping",
    )
    resources: Resources = Field(default=Resources(), description="what each engine reserves in the Ray cluster")
    serve: ServeConfig = Field(default=ServeConfig(), description="where Ray Serve listens for the arms")
    # Which (policy, topology) pairs become arms; default: every policy on every topology.
    arms_only: list[ArmSelection] | None = Field(default=None, alias="arms", min_length=1)
    shapes: dict[str, Shape] = Field(
        default_factory=dict,
        description="name -> load shape; every arm runs every shape `repeats` times with the same traffic",
    )
    mix: RequestMix = Field(
        default_factory=_default_mix, description="the requests: weighted workloads or a JSONL dataset"
    )
    slo: SloConfig = Field(default=SloConfig(), description="deadlines that make a request count toward goodput")
    warmup: WarmupConfig = Field(
        default=WarmupConfig(), description="unmeasured requests to each arm after it is deployed"
    )
    repeats: int = Field(
        default=1, ge=1, le=100, description="runs of every shape on every arm (each repeat its own seeded traffic)"
    )
    seed: int = Field(
        default=0,
        description="seeds all traffic: arrival times and requests depend on it, the shape and the repeat only",
    )
    output: str | None = None  # the run directory or URI; default runs/<name>
    # prediction.json of `specdrill tune`: the report of this campaign (its rehearsal) compares its map with it
    prediction: str | None = None
    load: LoadConfig = Field(default=LoadConfig(), description="the load workers")
    gates: GateConfig = Field(
        default=GateConfig(), description="what makes the run and the report exit non-zero (exit code 3)"
    )
    analysis: AnalysisConfig = AnalysisConfig()
    store_prompts: bool = False  # traces keep prompt hashes unless this is set
    _recorded: bool = PrivateAttr(default=False)  # read back from a run's manifest: its files are not read

    @field_validator("mix", mode="after")
    @classmethod
    def _mix_within_max_model_len(cls, v: RequestMix, info: ValidationInfo) -> RequestMix:
        """A data set's rows longer than the engine's max_model_len are skipped (counted and said, dataset_lines)."""
        engine = info.data.get("engine")
        return v if engine is None else v.within(kind_of(engine).max_model_len(engine))

    @model_validator(mode="after")
    def _note_recorded(self, info: ValidationInfo) -> Campaign:
        self._recorded = not reads_files(info)
        return self

    @model_validator(mode="after")
    def _sessions_not_under_a_replay_with_lengths(self) -> Campaign:
        """A trace that records its requests' lengths is replayed request by request, the mix only lending text:
        sessions' later turns would silently not be sent."""
        if self._recorded:  # mix.sources detects its file's format: a recorded campaign reads no file
            return self
        played = self.mix.session_datasets
        if played:
            replays = sorted(n for n, s in self.shapes.items() if isinstance(s, Replay) and s.has_lengths)
            if replays:
                raise ValueError(
                    f"shapes: {replays[0]} replays a trace with its requests' lengths, which sends its recorded "
                    f"requests one for one: the mix's sessions ({played[0]}) would not be played; replay it "
                    "without lengths (a trace of arrivals) or drop `sessions`"
                )
        return self

    @field_validator("shapes", mode="before")
    @classmethod
    def _shape_names(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for key in v:
                if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,40}", key):
                    raise ValueError(f"shape name {key!r}: lower-case letters, digits, - and _ only")
        return v

    def output_dir(self) -> str:
        return self.output or f"runs/{self.name}"

    def require_traffic(self, *, real_time: bool = False, all_units_at_once: bool = False) -> None:
        """What `run` and `simulate` need beyond what `deploy` does, the plan's size within the limits included
        (checked before anything is written: orchestrator/plan/size.py)."""
        self._require_arms()
        problem = refusal(self.planned_size(real_time=real_time, all_units_at_once=all_units_at_once))
        if problem is not None:
            raise CampaignError(problem)
        if not self._recorded:  # a recorded campaign's data sets are read when it is run (campaign_files.RECORDED)
            self.dataset_lines()

    def dataset_lines(self) -> list[str]:
        """A line per data set of the mix: rows sent, skipped over max_model_len and why, whose tokens counted
        them (orchestrator/plan/datasets.py); one line refusing a data set that sends nothing. Counted once."""
        try:
            return derived(self, DATASET_LINES, (self.mix, self.engine, self.load), lambda: dataset_lines(
                self.mix, self.engine, self.load.endpoint
            ))  # fmt: skip
        except DatasetRefused as exc:
            raise CampaignError(str(exc)) from None

    def generated_text_lines(self) -> list[str]:
        """The warning that a real engine gets template text (orchestrator/plan/generated_text.py); none else."""
        return generated_text_lines(self.engine, self.mix, self.shapes)

    def run_notes(self) -> dict[str, list[str]]:
        """What a run records of its traffic when it starts (the manifest), for summary.json and the report to
        say without reading the campaign's files again: each data set's line, the template-text warning."""
        return {"datasets": self.dataset_lines(), "generated_text": self.generated_text_lines()}

    def planned_size(self, *, real_time: bool = False, all_units_at_once: bool = False) -> PlanSize:
        arms = self.arms()
        return planned_size(
            shapes=self.shapes, mix=self.mix, arms=len(arms), repeats=self.repeats, profile=self._profile(),
            max_k=self._max_k(arms), real_time=real_time, max_model_len=self._max_model_len(),
            all_units_at_once=all_units_at_once,
        )  # fmt: skip

    def require_search_size(
        self, *, unit_requests: int, rate: float, budget_requests: int | None, real_time: bool
    ) -> None:
        """A search's plan: two arms, units of `unit_requests` each at its highest rate, as many units as its budget
        pays for (one without a budget: the search's length is not known before it narrows)."""
        units = max(1, -(-budget_requests // (2 * unit_requests))) if budget_requests else 1
        size = planned_size(
            shapes={"unit": Sustained(rate=rate, duration_s=unit_requests / rate)}, mix=self.mix, arms=2,
            repeats=units, profile=self._profile(), max_k=self._max_k(self.arms()), real_time=real_time,
            max_model_len=self._max_model_len(),
        )  # fmt: skip
        problem = refusal(size)
        if problem is not None:
            raise CampaignError(problem)

    def _max_model_len(self) -> int | None:
        """Where known: a longer request is refused at once (a closed loop then sends as fast as it is refused)."""
        return getattr(self.engine, "max_model_len", None)

    @staticmethod
    def _max_k(arms: list[ArmSpec]) -> int:
        return max((a.policy.resolve(a.topology).num_speculative_tokens for a in arms), default=0)

    def warnings(self) -> list[str]:
        """Valid settings that cannot mean what they say (orchestrator/plan/plausible.py), and what the engine kind
        will run differently from how the arms are written (a vLLM that drops a schedule): one line each."""
        lines = kind_of(self.engine).arm_warnings(self.engine, self.arms())
        profile = self._profile()
        if profile is None:
            return lines
        return lines + slo_warnings(self.slo, profile, self._max_k(self.arms()))

    def _require_arms(self) -> None:
        if not self.shapes:
            raise CampaignError("shapes: a campaign needs at least one shape to run")
        arms = self.arms()
        has_off = any(arm.policy.kind == "off" for arm in arms)
        if self.analysis.absolute_only:
            if has_off:
                raise CampaignError(
                    "analysis.absolute_only: the campaign has an `off` arm; drop the key to measure speedups against it"
                )
            return
        if not has_off:
            raise CampaignError(
                "arms: no arm runs with speculation off; every speedup is measured against one (for absolute "
                "figures only, without speedups, set analysis: {absolute_only: true})"
            )
        try:
            baselines(arms)
        except BaselineError as exc:
            raise CampaignError(f"arms: {exc}") from None

    @field_validator("policies", "topologies", mode="before")
    @classmethod
    def _string_keys(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for key in v:
                if isinstance(key, bool):
                    raise ValueError(
                        f'name {key!r} is a YAML boolean: quote it ("off": ...), YAML reads off/on/yes/no as booleans'
                    )
        return v

    @field_validator("topologies", mode="before")
    @classmethod
    def _topologies(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {name: _topology(t) for name, t in v.items()}
        return v

    @model_validator(mode="after")
    def _arms_valid(self) -> Campaign:
        arms = self.arms()  # every policy must parse against the engine, every arm name must be a valid slug
        names = {a.name for a in arms}
        unknown = sorted(set(self.gates.exempt_arms) - names)
        if unknown:
            raise ValueError(f"gates.exempt_arms: no arm named {unknown[0]} (arms: {', '.join(sorted(names))})")
        kind_of(self.engine).check_arm_names(self.engine, {a.name for a in arms})
        return self

    def _profile(self) -> Profile | None:
        return self.planned_arms().profile

    def max_num_seqs(self, profile: Profile | None = None) -> int:
        """The engines' max_num_seqs: the profile's or the engine's where the campaign sets it, else 512 (vLLM's
        default the simulated profiles share)."""
        if profile is not None:
            return engine_max_num_seqs(self.engine, profile)
        return self.planned_arms().max_num_seqs

    def arms(self) -> list[ArmSpec]:
        """The campaign's arms (orchestrator/plan/arms.py), built once per loaded campaign: the same arm objects
        on every call, in a list of the caller's own."""
        return list(self.planned_arms().arms)

    def planned_arms(self) -> CampaignArms:
        """The arms with the profile and max_num_seqs they were built with, computed on the first call and kept
        (a model_copy that changes what they are built from builds its own)."""
        inputs = (self.name, self.engine, self.policies, self.topologies, self.arms_only, self.resources)
        picks = None if self.arms_only is None else [(p.policy, p.topology) for p in self.arms_only]
        return derived(self, ARMS, inputs, lambda: build_arms(
            campaign=self.name, engine=self.engine, policies=self.policies, topologies=self.topologies, picks=picks,
            resources=self.resources,
        ))  # fmt: skip


bind_engine_field(Campaign)  # a kind registered later (a plug-in, a test's toy) is accepted here too

# PyYAML holds ~50x a file's size while it parses; a campaign is a few KiB (10,000 arms spelled out: ~0.5 MiB).
MAX_CAMPAIGN_BYTES = 8 << 20


def load_campaign(path: str | Path) -> Campaign:
    p = Path(path)
    if p.is_file() and p.stat().st_size > MAX_CAMPAIGN_BYTES:
        size = p.stat().st_size / 2**20
        raise CampaignError(f"campaign file {p}: {size:.0f} MiB, over the {MAX_CAMPAIGN_BYTES >> 20} MiB a campaign "
                            "may be (its YAML is parsed whole)")  # fmt: skip
    text = read_text(p, "campaign file", CampaignError)
    # The files it names (a replay's trace, a mix's dataset) are read relative to the file's own directory.
    context = {FILES_RELATIVE_TO: str(p.absolute().parent)}
    return load_yaml_model(text, Campaign, origin=f"campaign {p}", error=CampaignError, context=context)


def campaign_with_arms(data: Any) -> tuple[Campaign, CampaignArms]:
    """A campaign as a run's manifest holds it, validated, with its arms: what a reader of a run derives from the
    campaign, in one call. Raises pydantic's ValidationError, or ValueError, where it is not a valid campaign. The
    files it names are not read (campaign_files.RECORDED): the run's trace holds what it sent."""
    campaign = Campaign.model_validate(data, context={RECORDED: True})
    return campaign, campaign.planned_arms()
