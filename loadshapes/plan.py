"""What one load worker sends: the plan (pydantic, a file the worker reads) and the schedule built from it.

Every arm gets the same traffic: arrival times and request contents depend on (seed, shape, repeat) only, never
on the arm or on how many workers split it. Request i has id `{arm}:{shape}:{repeat}:{i}` so the report can pair
request i across arms.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from loadshapes.arrivals import shape_arrivals, worker_share
from loadshapes.datasets.sampling import dataset_sessions
from loadshapes.limits import Limits, current_limits, using
from loadshapes.mixes import RequestMix, RequestSpec
from loadshapes.sessions import SessionTurn
from loadshapes.shapes import Replay, Shape
from loadshapes.slo import SloConfig
from loadshapes.spec_fields import SpeculationFields
from loadshapes.tokens import PromptTokenizer, prompt_tokenizer


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    base_url: str  # up to the arm's prefix, e.g. http://127.0.0.1:8000/demo/off
    model: str
    endpoint: Literal["completions", "chat"] = "completions"
    api_key_env: str | None = None  # the NAME of an environment variable; keys never enter plans or traces
    # What to ask the server about speculation and where its answer lies: the engine kind's dialect.
    speculation: SpeculationFields = Field(default_factory=SpeculationFields)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


class WorkerPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    campaign: str
    run: str
    arm: str
    policy: str | None = None
    topology: str | None = None
    shape_name: str
    # The limits the run was planned under (`--limit`): a load worker re-reads a replay shape's file under them,
    # not under its own process's defaults. Declared before `shape`, whose validation reads it.
    limits: Limits = Field(default_factory=current_limits)
    shape: Shape
    repeat: int = Field(default=0, ge=0)
    traffic_repeat: int | None = Field(default=None, ge=0)  # whose traffic this repeat sends; None: its own
    mix: RequestMix
    seed: int = 0
    process: Literal["poisson", "gamma", "constant"] = "poisson"
    cv: float = Field(default=1.0, gt=0)
    worker: int = Field(default=0, ge=0)
    workers: int = Field(default=1, ge=1)
    target: Target
    trace_root: str
    start_ns: int | None = None  # the common start (epoch ns); None: wait for a go file, or start on launch
    go_file: str | None = None  # the orchestrator writes the common start time here once every worker is ready
    ready_file: str | None = None
    summary_file: str | None = None
    flush_rows: int = Field(default=1000, ge=1)
    flush_s: float = Field(default=5.0, gt=0)
    lateness_bound_s: float = Field(default=0.005, gt=0)  # p99 send lateness above this: generator saturated
    drain_s: float = Field(default=120.0, ge=0)  # after the last send, how long in-flight requests may finish
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_in_flight: int = Field(default=4096, ge=1)
    spin_s: float = Field(default=0.001, ge=0)  # wait the last stretch before a send by polling, not a timer
    store_token_times: bool = True
    # The per-step lists in each row (batch size, k, drafted, accepted). Their summaries are always written;
    # the lists only for arms without an engine step timeline (endpoints) or when asked for.
    store_step_lists: bool = False
    progress_file: str | None = None  # live counters, rewritten every second (the actor turns them into metrics)
    slo: SloConfig | None = None  # the campaign's, for the live goodput counter; None: every ok request counts
    write_trace: bool = True  # False only to measure what writing the trace costs (benchmarks/bench_loadgen.py)
    store_prompts: bool = False
    # The served model's tokenizer: prompt lengths in its tokens, as the server counts them. `tokenizer` names it
    # (a path or Hugging Face id, for the record), `tokenizer_json` is its tokenizer.json, loaded where the run
    # started: a worker's node need not hold the model. None: lengths in words (a simulated engine, or an
    # endpoint with none named).
    tokenizer: str | None = None
    tokenizer_json: str | None = Field(default=None, repr=False)

    @field_validator("shape", mode="wrap")
    @classmethod
    def _under_the_runs_limits(
        cls, value: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Shape:
        with using(info.data.get("limits", current_limits())):
            shape: Shape = handler(value)
        return shape

    @model_validator(mode="after")
    def _worker_in_range(self) -> WorkerPlan:
        if self.worker >= self.workers:
            raise ValueError(f"worker {self.worker} outside 0..{self.workers - 1}")
        if (self.tokenizer is None) != (self.tokenizer_json is None):
            raise ValueError("tokenizer and tokenizer_json come together")
        return self

    def traffic_seed(self, purpose: str) -> int:
        """Depends on the seed, shape and repeat only: paired traffic across arms."""
        repeat = self.repeat if self.traffic_repeat is None else self.traffic_repeat
        key = zlib.crc32(f"{purpose}:{self.shape_name}:{repeat}".encode())
        return int(np.random.SeedSequence([self.seed, key]).generate_state(1)[0])

    def meets_slo(self, category: str | None, ttft: float | None, tpot: float | None, e2e: float | None) -> bool:
        """For an ok row: whether it counts toward goodput."""
        return self.slo is None or self.slo.met(category, ok=True, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e)

    def prompt_tokenizer(self) -> PromptTokenizer | None:
        if self.tokenizer is None or self.tokenizer_json is None:
            return None
        # vLLM adds the tokenizer's special tokens (a BOS) to a completion's prompt; a chat prompt's come from the
        # chat template, around the content counted here.
        return prompt_tokenizer(
            self.tokenizer_json, name=self.tokenizer, add_special_tokens=self.target.endpoint == "completions"
        )

    def request_id(self, index: int) -> str:
        return f"{self.arm}:{self.shape_name}:{self.repeat}:{index}"


@dataclass(frozen=True)
class Planned:
    index: int
    offset_s: float
    phase: str
    spec: RequestSpec
    body: bytes
    offered_rate_rps: float | None = None  # the shape's rate at offset_s (open loop)
    session: SessionTurn | None = None  # a turn of a multi-turn session (loadshapes/sessions.py)

    @property
    def prompt_sha256(self) -> str:
        return hashlib.sha256(self.spec.prompt.encode()).hexdigest()


def request_body(plan: WorkerPlan, spec: RequestSpec, session: SessionTurn | None = None) -> bytes:
    """The JSON body; a session's later turn carries its history (spec.prompt is then session.text())."""
    body: dict[str, object] = {
        "model": plan.target.model,
        "max_tokens": spec.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "specdrill": spec.body_hints(),
        **plan.target.speculation.body,
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if plan.target.endpoint == "chat":
        body["messages"] = session.messages() if session else [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return json.dumps(body, separators=(",", ":")).encode()


def open_loop_schedule(plan: WorkerPlan) -> list[Planned]:
    """This worker's share of the shape's arrivals, in send order, with bodies built ahead of the run."""
    offsets = shape_arrivals(plan.shape, process=plan.process, seed=plan.traffic_seed("arrivals"), cv=plan.cv)
    indices = worker_share(np.arange(len(offsets)), plan.worker, plan.workers)
    mine = offsets[indices]
    phases = plan.shape.phase_at(mine) if len(mine) else np.array([], dtype=str)
    rates = np.asarray(plan.shape.rate_at(mine), dtype=np.float64) if len(mine) else np.zeros(0)
    tokenizer = plan.prompt_tokenizer()
    if isinstance(plan.shape, Replay) and plan.shape.has_lengths:  # the trace's lengths for request i, not the mix's
        recorded = plan.shape.requests(indices)
        specs = plan.mix.replayed(
            (int(i) for i in indices), seed=plan.traffic_seed("requests"), recorded=recorded, tokenizer=tokenizer
        )
        sessions: list[SessionTurn | None] = [None] * len(specs)
    else:
        specs = plan.mix.at((int(i) for i in indices), seed=plan.traffic_seed("requests"), tokenizer=tokenizer)
        sessions = first_turns(plan, [int(i) for i in indices], tokenizer)
    return [
        Planned(int(i), float(t), str(p), s, request_body(plan, s), float(r), session)
        for i, t, p, s, r, session in zip(indices, mine, phases, specs, rates, sessions, strict=True)
    ]


def first_turns(plan: WorkerPlan, indices: list[int], tokenizer: PromptTokenizer | None) -> list[SessionTurn | None]:
    """Each request's session (None: a single-turn request): only data set entries with `sessions` have one."""
    sources = plan.mix.sources
    if not any(source.sessions for source in sources):
        return [None] * len(indices)
    return dataset_sessions(sources, indices, plan.traffic_seed("requests"), tokenizer)


def closed_loop_request(plan: WorkerPlan, index: int) -> Planned:
    """A closed-loop user's request `index` (sent when its previous one ended): offset and phase come at send."""
    tokenizer = plan.prompt_tokenizer()
    spec = plan.mix.at([index], seed=plan.traffic_seed("requests"), tokenizer=tokenizer)[0]
    session = first_turns(plan, [index], tokenizer)[0]
    return Planned(index, 0.0, plan.shape.phases()[0].name, spec, request_body(plan, spec), session=session)


def closed_loop_users(plan: WorkerPlan) -> int:
    """This worker's share of a closed-loop shape's users (round-robin, so the total is exact)."""
    users = int(getattr(plan.shape, "users", 0))
    return len(range(plan.worker, users, plan.workers))
