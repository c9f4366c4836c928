"""A run's engine steps as arrays for the fit: one row per step of every complete unit's timeline."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.analysis.inputs import RunInputs
from serve_apps.engine_kinds.registry import kind_of
from serve_apps.policies import DynamicPolicy, OffPolicy

FIT_COLUMNS = ("batch_size", "k", "batched_tokens", "kv_tokens", "num_prefill")


@dataclass(frozen=True)
class ArmSteps:
    """Steps of one arm, in time order within each (unit, engine); k is NaN where the engine could not see it."""

    arm: str
    speculative: bool
    dynamic: bool
    unit: np.ndarray  # "shape/r<repeat>" per step
    engine: np.ndarray  # engine id per step
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


def arm_steps(inputs: RunInputs, *, repeats: Collection[int] | None = None) -> dict[str, ArmSteps]:
    """Per arm with a timeline, its steps (complete units; `repeats`: only these repeats). Endpoint runs: {}."""
    if kind_of(inputs.campaign.engine).telemetry != "step_timeline":
        return {}
    store = inputs.store
    policies = {arm.name: arm.policy for arm in inputs.campaign.arms()}
    tables: dict[str, list[pa.Table]] = {}
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
            table = pq.read_table(handle)
        if not table.num_rows:
            continue
        n = table.num_rows
        for name in FIT_COLUMNS:  # timelines written before the fit's columns existed read as nulls
            if name not in table.column_names:
                table = table.append_column(name, pa.nulls(n, pa.int32()))
        table = table.append_column("unit", pa.array([f"{unit.shape}/r{unit.repeat}"] * n, pa.string()))
        tables.setdefault(unit.arm, []).append(table)
    out = {}
    for arm, parts in tables.items():
        t = pa.concat_tables(parts, promote_options="permissive")
        keys = (t["start_ns"].to_numpy(), np.asarray(t["engine_id"].to_pylist()), np.asarray(t["unit"].to_pylist()))
        order = np.lexsort(keys)
        t = t.take(pa.array(order))

        def values(name: str, table: pa.Table = t) -> np.ndarray:
            return np.asarray(table[name].cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=float)

        missing = [c for c in ("batched_tokens", "kv_tokens") if t[c].null_count == t.num_rows]
        unit_ids = np.asarray(t["unit"].to_pylist(), dtype=object)
        engines = np.asarray(t["engine_id"].to_pylist(), dtype=object)
        start, end = t["start_ns"].to_numpy(), t["end_ns"].to_numpy()
        gap = np.full(t.num_rows, np.nan)
        same = (unit_ids[1:] == unit_ids[:-1]) & (engines[1:] == engines[:-1])
        gap[1:] = np.where(same, (start[1:] - end[:-1]) / 1e9, np.nan)
        decodes = values("batch_size") - np.nan_to_num(values("num_prefill"))
        policy = policies.get(arm)
        out[arm] = ArmSteps(
            arm=arm,
            speculative=not isinstance(policy, OffPolicy),
            dynamic=isinstance(policy, DynamicPolicy),
            unit=unit_ids,
            engine=engines,
            seconds=(end - start) / 1e9,
            batch=values("batch_size"),
            k=values("k"),
            batched=values("batched_tokens"),
            kv=values("kv_tokens"),
            gap=gap,
            busy=np.asarray(~np.isnan(gap) & (decodes > 0), dtype=bool),
            missing=(
                f"its timeline has no {' or '.join(missing)} (written by an older specdrill, or vLLM without "
                "iteration details)"
            )
            if missing
            else None,
        )
    return out
