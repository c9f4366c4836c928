"""A run's planned size, computed before anything is written, and checked against the operator's limits.

Cheap by construction: requests come from the shapes' integrals (rate x duration, never the arrivals themselves),
tokens from the mix's `high` bounds (or a replay window's recorded lengths, read and counted when the campaign was
loaded), memory and time from costs measured on the simulator (docs/reference/campaign-reference.md, "Limits"). A figure
over its limit refuses the run in one line naming every figure, and how to raise the limit.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from loadshapes import limits
from loadshapes.limits import Limits, figure, raise_hint
from loadshapes.mixes import Fixed, Lengths, LogNormal, RequestMix, Uniform
from loadshapes.shapes import Concurrency, Replay, ShapeBase
from serve_apps.sim.profile import Profile

GIB = 1 << 30
# Measured with `specdrill simulate` (peak RSS, 2,000-20,000 requests of fixed and lognormal lengths): the
# interpreter and its libraries, then per request of the unit in flight (its spec, body, record and trace row),
# per prompt token (the prompt text twice: spec and body) and per output token (token times, step summaries).
# Rounded up about 1.5x from the fit, so a plan the estimate admits stays under its figure.
BASE_BYTES = 0.4 * GIB
REQUEST_BYTES = 15_000
PROMPT_TOKEN_BYTES = 40
OUTPUT_TOKEN_BYTES = 120
REPLAY_ROW_BYTES = 60  # a replay window's arrays (times, rows, offsets, sources) per row kept
DATASET_FACTOR = 4  # a JSONL dataset held as request specs: its bytes about 4 times
USER_BYTES = 2_000  # a closed-loop user's state
# The simulator's cost per request and arm (measured 0.21-0.6 ms on a shared 2-core machine) and per unit.
SIM_REQUEST_S = 6e-4
SIM_UNIT_S = 0.2
DEPLOY_S = 60.0  # a real run's deploy and warm-up per arm
STEP_FLOOR_S = 0.005  # the fastest step assumed of an engine without a profile (vLLM, an endpoint)
# A request the engine refuses comes back this fast (virtual.traffic.ERROR_RESPONSE_S) and its closed-loop user
# sends the next at once: where the mix can draw such a request, that is the pace of a closed loop.
ERROR_RESPONSE_S = 0.001
DATASET_TOKENS = 1024.0  # a dataset's lengths are its rows': assumed, not read, for the estimate


@dataclass(frozen=True)
class Tokens:
    largest: float  # prompt + output tokens of the longest request
    mean_prompt: float
    mean_output: float
    largest_asked: float  # prompt + max_tokens of the longest request: above max_model_len it is refused


@dataclass(frozen=True)
class PlanSize:
    arms: int
    units: int
    requests: float  # every arm and unit
    tokens: float  # upper bound: requests x the longest request
    request_tokens: float
    memory_gib: float
    hours: float
    mode: str  # "real time" or "virtual time"

    def line(self) -> str:
        return (
            f"{self.arms} arms x {self.units // max(self.arms, 1)} shape-repeats = {figure(self.units)} units, "
            f"{figure(self.requests)} requests (up to {figure(self.tokens)} tokens, {figure(self.request_tokens)} "
            f"in the longest request), ~{_gib(self.memory_gib)}, ~{_duration(self.hours)} in {self.mode}"
        )

    def over(self, lim: Limits) -> str | None:
        """One line naming the first figure over its limit and every figure, or None when the plan fits."""
        checks = (
            ("request_tokens", self.request_tokens, "tokens in one request"),
            ("units", self.units, "units"),
            ("requests", self.requests, "requests"),
            ("memory_gib", self.memory_gib, "GiB estimated"),
            ("hours", self.hours, "hours estimated"),
        )
        for name, value, what in checks:
            most = getattr(lim, name)
            if not value <= most:  # NaN and inf are over
                raise_it = f"raise it with {raise_hint(name, value)}" if math.isfinite(value) else "no limit admits it"
                return (
                    f"planned run too large: {figure(value)} {what}, over the limit of {figure(most)} (limit {name}; "
                    f"{raise_it}): {self.line()}"
                )
        return None


def _gib(gib: float) -> str:
    return f"{gib:.3g} GiB" if math.isfinite(gib) else "unbounded GiB"


def _duration(hours: float) -> str:
    if not math.isfinite(hours):
        return "unbounded time"
    if hours < 1 / 3600:
        return "under 1 s"
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    if hours < 2:
        return f"{hours * 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:,.0f} days"


def _high(lengths: Lengths) -> float:
    if isinstance(lengths, Fixed):
        return float(lengths.value)
    return float(lengths.high)


def _mean(lengths: Lengths) -> float:
    if isinstance(lengths, Fixed):
        return float(lengths.value)
    if isinstance(lengths, Uniform):
        return (lengths.low + lengths.high) / 2
    assert isinstance(lengths, LogNormal)
    # The unclipped mean bounds the clipped one from above only below `high`; clipping bounds it there.
    return min(lengths.median * math.exp(min(lengths.sigma**2 / 2, 700.0)), float(lengths.high))


def mix_tokens(mix: RequestMix) -> Tokens:
    """The mix's longest request (its `high` bounds) and mean lengths (weighted by the entries' weights)."""
    if mix.dataset is not None or mix.datasets:
        return Tokens(largest=2 * DATASET_TOKENS, mean_prompt=DATASET_TOKENS, mean_output=DATASET_TOKENS,
                      largest_asked=math.inf)  # fmt: skip
    largest, prompt, output, total, asked = 0.0, 0.0, 0.0, 0.0, 0.0
    for entry in mix.entries:
        w = entry.resolved()
        out_high = float(w.max_tokens) if w.ignore_eos else min(_high(w.output_tokens), float(w.max_tokens))
        out_mean = float(w.max_tokens) if w.ignore_eos else min(_mean(w.output_tokens), float(w.max_tokens))
        largest = max(largest, _high(w.prompt_tokens) + out_high)
        asked = max(asked, _high(w.prompt_tokens) + w.max_tokens)
        prompt += entry.weight * _mean(w.prompt_tokens)
        output += entry.weight * out_mean
        total += entry.weight
    return Tokens(largest=largest, mean_prompt=prompt / total, mean_output=output / total, largest_asked=asked)


def fastest_step_s(profile: Profile | None) -> float:
    """The shortest step the engine can take: one request, one token, nothing drafted."""
    if profile is None:
        return STEP_FLOOR_S
    v = profile.verify
    return v.per_kv_token + v.per_batched_token + v.fixed + profile.step_overhead


def shape_requests(
    shape: ShapeBase, tokens: Tokens, profile: Profile | None, max_k: int, max_model_len: int | None
) -> float:
    """Requests one arm gets in one unit of the shape: the rate's integral, a replay window's count, or for closed
    loop an upper bound (every user served back to back at the fastest step, k + 1 tokens a step, or refused at
    once where the mix can ask for more than max_model_len)."""
    if isinstance(shape, Concurrency):
        if max_model_len is not None and tokens.largest_asked > max_model_len:
            return shape.users * shape.duration_s / ERROR_RESPONSE_S
        steps = max(1.0, tokens.mean_output / (max_k + 1))
        return shape.users * shape.duration_s / (fastest_step_s(profile) * steps)
    return float(shape.expected_requests)


def planned_size(
    *,
    shapes: Mapping[str, ShapeBase],
    mix: RequestMix,
    arms: int,
    repeats: int,
    profile: Profile | None,
    max_k: int,
    real_time: bool,
    max_model_len: int | None = None,
    all_units_at_once: bool = False,
) -> PlanSize:
    """The plan's figures from the campaign's pieces (nothing built). `all_units_at_once`: the command holds every
    unit's traffic together (tune), not one unit's at a time."""
    tokens = mix_tokens(mix)
    per_request = REQUEST_BYTES + PROMPT_TOKEN_BYTES * tokens.mean_prompt + OUTPUT_TOKEN_BYTES * tokens.mean_output
    largest_tokens = tokens.largest
    held = float(BASE_BYTES)
    if mix.dataset is not None and os.path.isfile(mix.dataset) and not mix.sources:
        # specdrill's own JSONL is held whole; the other formats are read a row at a time (their offsets kept).
        held += DATASET_FACTOR * os.path.getsize(mix.dataset)
    unit_bytes: list[float] = []
    requests = 0.0
    seconds = 0.0
    for shape in shapes.values():
        n = shape_requests(shape, tokens, profile, max_k, max_model_len)
        own = per_request
        if isinstance(shape, Replay):
            recorded = shape.recorded_lengths()
            if recorded is not None:
                largest_tokens = max(largest_tokens, recorded[0] + recorded[1])
                own = REQUEST_BYTES + PROMPT_TOKEN_BYTES * recorded[2] + OUTPUT_TOKEN_BYTES * recorded[3]
            held += REPLAY_ROW_BYTES * len(shape.offsets())
        if isinstance(shape, Concurrency):
            held += USER_BYTES * shape.users
        unit_bytes.append(n * own)
        requests += n * arms * repeats
        seconds += (shape.duration * arms if real_time else n * arms * SIM_REQUEST_S) * repeats
    units = arms * len(shapes) * repeats
    seconds += DEPLOY_S * arms if real_time else SIM_UNIT_S * units
    traffic = sum(unit_bytes) * repeats if all_units_at_once else max(unit_bytes, default=0.0)
    return PlanSize(
        arms=arms, units=units, requests=requests, tokens=requests * largest_tokens, request_tokens=largest_tokens,
        memory_gib=(held + traffic) / GIB, hours=seconds / 3600, mode="real time" if real_time else "virtual time",
    )  # fmt: skip


def refusal(size: PlanSize) -> str | None:
    """The one line that refuses the plan under the limits in effect, or None."""
    return size.over(limits.current())
