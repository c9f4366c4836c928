"""A completed unit's part files merged into one: every row kept, other units untouched, nothing deleted that is
not in the merged file, and a rerun of a partial unit still removes everything the unit wrote."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from loadshapes.trace import TraceWriter, read_traces, writer_id
from orchestrator.rundir.layout import RunStore, Unit
from orchestrator.rundir.unit_files import MERGED_ROW_GROUP, merge_parts
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table

UNIT = Unit(arm="dyn", shape="ramp", repeat=0)


def _write(root: Path, repeat: int, worker: int, n: int, flush_rows: int) -> pa.Table:
    table = trace_table(
        arm=["dyn"] * n,
        shape=["ramp"] * n,
        repeat=[repeat] * n,
        request_index=list(range(worker * 10_000, worker * 10_000 + n)),
        request_id=[f"dyn:ramp:{repeat}:{worker * 10_000 + i}" for i in range(n)],
        scheduled_ns=[START_NS + i for i in range(n)],
        ttft_s=[0.001 * i for i in range(n)],
    )
    writer_of_worker = writer_id("dyn", "ramp", repeat, worker)
    writer = TraceWriter(str(root / "traces"), writer_id=writer_of_worker, flush_rows=flush_rows)
    for row in table.to_pylist():
        writer.append(row)
    writer.close()
    return table


def _rows(table: pa.Table, repeat: int) -> list[tuple[object, ...]]:
    mine = table.filter(pc.equal(table["repeat"], repeat))
    return sorted(zip(*(mine[c].to_pylist() for c in ("request_id", "scheduled_ns", "ttft_s")), strict=True))


def test_a_units_parts_become_one_file_with_every_row(tmp_path: Path) -> None:
    written = pa.concat_tables([_write(tmp_path, 0, 0, 250, 7), _write(tmp_path, 0, 1, 180, 11)])
    other = _write(tmp_path, 1, 0, 40, 7)  # repeat 1 (another unit) in the same directory: not merged
    directory = tmp_path / "traces" / "arm=dyn" / "shape=ramp"
    others_before = sorted(p.name for p in directory.glob(f"{Unit(arm='dyn', shape='ramp', repeat=1).part_prefix}*"))
    store = RunStore(str(tmp_path))
    merged = merge_parts(store, UNIT)
    assert merged is not None and Path(merged).name.startswith(UNIT.part_prefix)
    assert sorted(p.name for p in directory.glob(f"{UNIT.part_prefix}*")) == [Path(merged).name]
    assert sorted(p.name for p in directory.glob(f"{Unit(arm='dyn', shape='ramp', repeat=1).part_prefix}*")) == (
        others_before
    )
    assert not list(directory.glob(".tmp-*"))
    meta = pq.read_metadata(merged)
    assert meta.num_rows == 430 and meta.num_row_groups == 1 and meta.row_group(0).num_rows <= MERGED_ROW_GROUP
    assert pq.read_schema(merged).metadata == written.schema.metadata  # the trace's version travels with it
    traces = read_traces(str(tmp_path / "traces"))
    assert _rows(traces, 0) == _rows(written, 0) and _rows(traces, 1) == _rows(other, 1)
    # A rerun of the unit (as if its marker were never written) removes the merged file like the parts.
    assert store.remove_partial(UNIT) == 1 and not list(directory.glob(f"{UNIT.part_prefix}*"))


def test_large_units_get_large_row_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("orchestrator.rundir.unit_files.MERGED_ROW_GROUP", 100)
    _write(tmp_path, 0, 0, 450, 30)
    merged = merge_parts(RunStore(str(tmp_path)), UNIT)
    assert merged is not None
    meta = pq.read_metadata(merged)
    assert meta.num_rows == 450 and [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == (
        [100] * 4 + [50]
    )


def test_nothing_to_merge_or_parts_that_differ_are_left_as_written(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    assert merge_parts(store, UNIT) is None  # no directory
    _write(tmp_path, 0, 0, 5, 100)
    directory = tmp_path / "traces" / "arm=dyn" / "shape=ramp"
    assert merge_parts(store, UNIT) is None and len(list(directory.glob("*.parquet"))) == 1  # one file already
    odd = pa.table({"request_id": ["dyn:ramp:0:99"]})
    pq.write_table(odd, directory / f"{UNIT.part_prefix}7-000000-odd.parquet")
    before = sorted(p.name for p in directory.glob("*.parquet"))
    assert merge_parts(store, UNIT) is None
    assert sorted(p.name for p in directory.glob("*.parquet")) == before
