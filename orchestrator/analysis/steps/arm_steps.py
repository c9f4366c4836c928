"""A run's engine steps as arrays for the fit: one row per step of every complete unit's timeline."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.analysis.read.inputs import RunInputs
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.policies import AnyPolicy, OffPolicy
from serve_apps.policy_kinds import facts

FIT_COLUMNS = ("batch_size", "k", "batched_tokens", "kv_tokens", "num_prefill")
STEP_COLUMNS = ("start_ns", "end_ns", "engine_id")  # every timeline has them


@dataclass(frozen=True)
class ArmSteps:
    """Steps of one arm, in time order within each (unit, engine); k is NaN where the engine could not see it."""

    arm: str
    speculative: bool
    dynamic: bool
    unit: np.ndarray  # the step's unit ("shape/r<repeat>"), as a code: equal codes, same unit
    engine: np.ndarray  # the step's engine id, as a code
    seconds: np.ndarray
    batch: np.ndarray
    k: np.ndarray
    batched: np.ndarray
    kv: np.ndarray
    # Seconds from the same engine's previous step's end to this step's start (NaN for a unit's first step), and
    # whether the engine was busy across it: this step decodes requests, which the previous one ran too.
    gap: np.ndarray
    busy: np.ndarray
    missing: str | None = None  # why this arm's timeline cannot be fitted (columns absent or null)

    def __len__(self) -> int:
        return len(self.seconds)

    def previous_k(self) -> np.ndarray:
        """The k of the same engine's previous step in the same unit (NaN for the first)."""
        out = np.full(len(self), np.nan)
        same = (self.unit[1:] == self.unit[:-1]) & (self.engine[1:] == self.engine[:-1])
        out[1:] = np.where(same, self.k[:-1], np.nan)
        return out


def timeline_files(inputs: RunInputs, *, repeats: Collection[int] | None = None) -> dict[str, list[tuple[str, str]]]:
    """Per arm, its complete units' non-empty step timelines: (unit "shape/r<repeat>", path). Endpoint runs: {}.
    Footers only: no step is read."""
    if kind_of(inputs.campaign.engine).telemetry != "step_timeline":
        return {}
    store = inputs.store
    out: dict[str, list[tuple[str, str]]] = {}
    for result in inputs.units:
        unit = result.unit
        if repeats is not None and unit.repeat not in repeats:
            continue
        path = (
            f"{store.base}/timelines/arm={quote(unit.arm, safe='')}/shape={quote(unit.shape, safe='')}"
            f"/r{unit.repeat}.parquet"
        )
        if store.fs.get_file_info(path).type != pafs.FileType.File:
            continue
        with store.fs.open_input_file(path) as handle:
            if not pq.ParquetFile(handle).metadata.num_rows:
                continue
        out.setdefault(unit.arm, []).append((f"{unit.shape}/r{unit.repeat}", path))
    return out


def missing_fit_columns(inputs: RunInputs, files: list[tuple[str, str]]) -> str | None:
    """Why these timelines cannot be fitted (batched or KV tokens absent or null in every step), else None.
    Reads those two columns only: a report that cannot fit an arm learns it without loading its steps."""
    nulls = {name: 0 for name in ("batched_tokens", "kv_tokens")}
    rows = 0
    for _, path in files:
        with inputs.store.fs.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            present = [name for name in nulls if name in parquet.schema_arrow.names]
            table = parquet.read(columns=present)
        rows += table.num_rows
        for name in nulls:
            nulls[name] += table[name].null_count if name in present else table.num_rows
    return _missing_line([name for name, count in nulls.items() if count == rows])


def _missing_line(missing: list[str]) -> str | None:
    if not missing:
        return None
    why = "written by an older specdrill, or vLLM without iteration details"
    return f"its timeline has no {' or '.join(missing)} ({why})"


BLOCK_STEPS = 1000  # a sampled fit keeps runs of this many consecutive steps of one engine (switches intact inside)


def timeline_steps(inputs: RunInputs, files: list[tuple[str, str]]) -> int:
    """How many steps these timelines hold, from their footers."""
    total = 0
    for _, path in files:
        with inputs.store.fs.open_input_file(path) as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    return total


def arm_steps(
    inputs: RunInputs, *, repeats: Collection[int] | None = None, arms: Collection[str] | None = None, every: int = 1
) -> dict[str, ArmSteps]:
    """Per arm with a timeline (`arms`: only these), its steps (complete units; `repeats`: only these repeats).
    `every` > 1: one block of BLOCK_STEPS consecutive steps of an engine in `every`, evenly over the run, so that
    the memory a fit holds is bounded however long the run. Endpoint runs: {}."""
    policies = {arm.name: arm.policy for arm in inputs.planned.arms}
    out = {}
    for arm, files in timeline_files(inputs, repeats=repeats).items():
        if arms is None or arm in arms:
            out[arm] = _read_arm(inputs, arm, files, policies.get(arm), every)
    return out


def _read_unit(inputs: RunInputs, path: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One unit's timeline: its columns as float arrays, its engines as codes, its start and end, in order of
    (engine, start). Only the columns used are read, and no Python string per step is kept (the report reads
    every step of a run)."""
    with inputs.store.fs.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        names = parquet.schema_arrow.names
        t = parquet.read(columns=[c for c in (*STEP_COLUMNS, *FIT_COLUMNS) if c in names])
    engine_names = pa.array(sorted(pc.unique(t["engine_id"]).to_pylist()), pa.string())
    engines = pc.index_in(t["engine_id"], value_set=engine_names).to_numpy().astype(np.int32)
    start, end = t["start_ns"].to_numpy(), t["end_ns"].to_numpy()
    order = np.lexsort((start, engines))
    # timelines written before the fit's columns existed read as NaN
    columns = {
        name: np.asarray(t[name].cast(pa.float64()).to_numpy(zero_copy_only=False)[order], dtype=float)
        if name in t.column_names else np.full(t.num_rows, np.nan)
        for name in FIT_COLUMNS
    }  # fmt: skip
    columns["start"], columns["end"] = start[order], end[order]  # integer nanoseconds: a float loses ~256 ns
    return columns, engines[order]


def _blocks(engines: np.ndarray) -> np.ndarray:
    """Each step's block: BLOCK_STEPS consecutive steps of one engine, numbered from 0 in order."""
    n = len(engines)
    first = np.r_[True, engines[1:] != engines[:-1]] if n else np.zeros(0, bool)
    run_start = np.maximum.accumulate(np.where(first, np.arange(n), 0)) if n else np.zeros(0, int)
    new_block = first | ((np.arange(n) - run_start) % BLOCK_STEPS == 0)
    return np.cumsum(new_block) - 1


def _read_arm(
    inputs: RunInputs, arm: str, files: list[tuple[str, str]], policy: AnyPolicy | None, every: int
) -> ArmSteps:
    """One arm's steps, units in the order of their names. Each kept stretch of consecutive steps (a unit, or a
    block of one when `every` > 1) gets its own code, so that no step follows one it did not follow."""
    parts: list[dict[str, np.ndarray]] = []
    stretch = blocks_seen = 0
    for _, path in sorted(files):
        columns, engines = _read_unit(inputs, path)
        if every == 1:
            codes = np.full(len(engines), stretch)
            stretch += 1
        else:
            block = _blocks(engines)
            keep = (block + blocks_seen) % every == 0
            blocks_seen += int(block[-1]) + 1 if len(block) else 0
            columns = {name: values[keep] for name, values in columns.items()}
            engines, block = engines[keep], block[keep]
            kept, index = np.unique(block, return_inverse=True)
            codes = stretch + index
            stretch += len(kept)
        columns["unit"], columns["engine"] = codes.astype(np.int32), engines
        parts.append(columns)
    joined = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]} if parts else {}
    unit_ids, engines = joined["unit"], joined["engine"]
    start, end = joined["start"], joined["end"]
    missing = [c for c in ("batched_tokens", "kv_tokens") if np.isnan(joined[c]).all()]
    gap = np.full(len(start), np.nan)
    same = (unit_ids[1:] == unit_ids[:-1]) & (engines[1:] == engines[:-1])
    gap[1:] = np.where(same, (start[1:] - end[:-1]) / 1e9, np.nan)
    batch = joined["batch_size"]
    decodes = batch - np.nan_to_num(joined["num_prefill"])
    return ArmSteps(
        arm=arm,
        speculative=not isinstance(policy, OffPolicy),
        dynamic=policy is not None and facts(policy.kind).adaptive,  # its k switches: what a switch costs
        unit=unit_ids,
        engine=engines,
        seconds=(end - start) / 1e9,
        batch=batch,
        k=joined["k"],
        batched=joined["batched_tokens"],
        kv=joined["kv_tokens"],
        gap=gap,
        busy=np.asarray(~np.isnan(gap) & (decodes > 0), dtype=bool),
        missing=_missing_line(missing),
    )
