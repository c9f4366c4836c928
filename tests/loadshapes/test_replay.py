from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from loadshapes.arrivals import shape_arrivals, worker_share
from loadshapes.replay_formats import timestamps
from loadshapes.shapes import Replay, Shape
from loadshapes.trace import TraceWriter, to_ns

SHAPES = TypeAdapter(Shape)
EPOCH = 1_800_000_000.0


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def trace_row(arm: str, shape: str, i: int, seconds: float) -> dict[str, Any]:
    return {
        "campaign": "c", "run": "r1", "arm": arm, "shape": shape, "request_id": f"{arm}-{shape}-{i}",
        "repeat": 0, "request_index": i, "scheduled_ns": to_ns(EPOCH + seconds), "status": "ok" if i % 4 else "error",
    }  # fmt: skip


@pytest.fixture
def trace_dir(tmp_path: Path) -> str:
    root = str(tmp_path / "traces")
    writer = TraceWriter(root, writer_id="w0", flush_rows=5, flush_s=3600)
    for i, t in enumerate([0.0, 0.25, 1.5, 1.75, 3.0, 4.5, 2.0]):  # out of order, as workers write them
        writer.append(trace_row("dyn", "ramp", i, t))
    for arm, shape in (("off", "ramp"), ("dyn", "quiet")):  # dyn/quiet: one part file, written at close
        for i, t in enumerate([10.0, 11.0, 30.0]):
            writer.append(trace_row(arm, shape, i, t))
    writer.close()
    return root


def test_relative_csv_replays_sorted_offsets_from_zero(tmp_path: Path) -> None:
    shape = Replay(path=write(tmp_path / "t.csv", "2.5\n0.5\n\n1.0\n1.25\n"))
    np.testing.assert_allclose(shape.offsets(), [0.0, 0.5, 0.75, 2.0])
    assert shape.open_loop and shape.expected_requests == 4
    assert shape.duration == pytest.approx(2.0 + 1e-6)
    np.testing.assert_array_equal(shape_arrivals(shape, process="gamma", seed=3, cv=4.0), shape.offsets())
    assert np.array_equal(shape_arrivals(shape, seed=1), shape_arrivals(shape, seed=2))  # the seed does not apply


def test_absolute_epoch_csv_and_named_column(tmp_path: Path) -> None:
    absolute = Replay(path=write(tmp_path / "a.csv", f"{EPOCH + 3}\n{EPOCH}\n{EPOCH + 0.5}\n"))
    np.testing.assert_allclose(absolute.offsets(), [0.0, 0.5, 3.0], atol=1e-6)
    named = Replay(
        path=write(tmp_path / "n.csv", "id, ts ,model\na,100.0,x\nb,101.5,x\n\nc,104,y\n"), column="ts", speed=2.0
    )
    np.testing.assert_allclose(named.offsets(), [0.0, 0.75, 2.0])  # speed 2 halves every gap
    explicit = Replay(path=write(tmp_path / "times.txt", "0\n1\n"), format="csv")
    assert explicit.expected_requests == 2


@pytest.mark.parametrize(
    ("text", "fields", "message"),
    [
        ("0\n1\n-2\n", {}, r"t\.csv:3: '-2' is negative"),
        ("0\nnan\n", {}, r"t\.csv:2: 'nan' is not a finite number"),
        ("0\n\n1\nsoon\n", {}, r"t\.csv:4: 'soon' is not a number \[type"),
        ("ts\n0\n", {}, r"t\.csv:1: 'ts' is not a number \(a header\? name the column with column\)"),
        ("0,1\n", {}, r"t\.csv:1: expected 1 fields, got 2; name the column to read with column"),
        ("a,ts\nx,1\ny\n", {"column": "ts"}, r"t\.csv:3: expected 2 fields, got 1 \[type"),
        ("a,b\n1,2\n", {"column": "ts"}, r"t\.csv:1: no column 'ts' in the header \(a, b\)"),
        ("\n\n", {}, r"t\.csv: no arrivals"),
        ("0\n1\n", {"arm": "dyn"}, r"t\.csv: arm and shape pick from a trace, not a CSV"),
    ],
)
def test_bad_csv_lines_say_where_and_what(tmp_path: Path, text: str, fields: dict[str, Any], message: str) -> None:
    path = write(tmp_path / "t.csv", text)
    with pytest.raises(ValidationError, match=message):
        Replay(path=path, **fields)


def test_bad_paths_and_fields(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"missing\.csv: no such file or directory"):
        Replay(path=str(tmp_path / "missing.csv"))
    assert Replay(path=write(tmp_path / "t.txt", "0\n3\n")).trace_format == "csv"  # told by its first line
    with pytest.raises(ValidationError, match="greater than 0"):
        Replay(path=write(tmp_path / "t.csv", "0\n"), speed=0)
    with pytest.raises(ValidationError, match=r"t\.csv: 1000 s in bins of 0\.001 s is over 100000 phases: raise bin_s"):
        Replay(path=write(tmp_path / "t.csv", "0\n1000\n"), duration_s=1000, bin_s=0.001)
    with pytest.raises(ValidationError, match=r"t\.parquet: not a readable Parquet file"):
        Replay(path=write(tmp_path / "t.parquet", "0\n"))


def test_phases_bin_the_offsets_and_count_exactly(tmp_path: Path) -> None:
    times = [0.0, 0.1, 0.2, 1.0, 2.5, 2.6, 2.7, 2.8, 5.0]  # 5.0 on a bin edge: no sliver bin after it
    shape = Replay(path=write(tmp_path / "t.csv", "\n".join(map(str, times))))
    names = [p.name for p in shape.phases()]
    assert names == ["replay00", "replay01", "replay02", "replay03", "replay04"]
    assert shape.expected_requests == len(times)
    assert sum(p.expected_requests for p in shape.phases()) == pytest.approx(len(times))
    assert shape.cumulative(shape.duration) == pytest.approx(len(times))
    rates = shape.rate_at(np.array([0.5, 1.5, 2.5, 3.5, 5.0]))
    np.testing.assert_allclose(rates, np.array([3, 1, 4, 0, 1 / (1 + 1e-6)]))  # per-bin counts over bin widths
    assert shape.cumulative(2.0) == pytest.approx(4)
    assert list(shape.phase_at(np.array([0.0, 1.0, 2.99, 5.0]))) == ["replay00", "replay01", "replay02", "replay04"]
    assert shape.phases()[-1].duration == pytest.approx(1.0 + 1e-6)
    fine = Replay(path=shape.path, bin_s=0.1, duration_s=12.0)
    assert fine.duration == pytest.approx(12.0) and len(fine.phases()) == 120
    assert fine.phases()[0].name == "replay000" and fine.expected_requests == len(times)
    assert Replay(path=shape.path, bin_s=100).phases()[0].name == "replay"
    cut = Replay(path=shape.path, duration_s=2.6)
    np.testing.assert_allclose(cut.offsets(), times[:5])
    assert cut.expected_requests == 5 and cut.duration == pytest.approx(2.6)


def test_worker_shares_union_is_every_arrival(tmp_path: Path) -> None:
    times = np.round(np.cumsum(np.random.default_rng(0).exponential(0.05, 500)), 4)
    shape = Replay(path=write(tmp_path / "t.csv", "\n".join(map(str, times))), speed=3.0)
    offsets = shape_arrivals(shape, seed=0)
    for workers in (1, 4, 7):
        parts = [worker_share(offsets, w, workers) for w in range(workers)]
        assert np.array_equal(np.sort(np.concatenate(parts)), offsets)
    assert len(offsets) == shape.expected_requests == 500


def test_parquet_trace_replays_scheduled_times(trace_dir: str) -> None:
    shape = Replay(path=trace_dir, arm="dyn", shape="ramp")
    np.testing.assert_allclose(shape.offsets(), [0.0, 0.25, 1.5, 1.75, 2.0, 3.0, 4.5], atol=1e-6)
    assert shape.expected_requests == 7
    off = Replay(path=trace_dir, arm="off", speed=10.0)  # one shape in that arm: the filter is enough
    np.testing.assert_allclose(off.offsets(), [0.0, 0.1, 2.0], atol=1e-6)
    part = next(Path(trace_dir, "arm=dyn", "shape=quiet").glob("part-*.parquet"))
    np.testing.assert_allclose(Replay(path=str(part)).offsets(), [0.0, 1.0, 20.0], atol=1e-6)
    with pytest.raises(ValidationError, match=r"3 arm/shape pairs \(dyn/quiet, dyn/ramp, off/ramp\): pick one"):
        Replay(path=trace_dir)
    with pytest.raises(ValidationError, match=r"no trace rows for arm='nope' shape=None"):
        Replay(path=trace_dir, arm="nope")
    with pytest.raises(ValidationError, match="column names a CSV column; a trace replays scheduled_ns"):
        Replay(path=trace_dir, arm="off", column="sent_ns")


def test_validates_from_data_and_loads_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "t.csv", "0\n1\n2\n")
    shape = SHAPES.validate_python({"kind": "replay", "path": path, "speed": 2, "bin_s": 0.5})
    assert isinstance(shape, Replay) and shape.expected_requests == 3 and shape.duration == pytest.approx(1 + 1e-6)
    reads: list[str] = []
    original = timestamps.csv_ns

    def counting(*args: Any) -> np.ndarray:
        reads.append(args[0])
        return original(*args)

    monkeypatch.setattr(timestamps, "csv_ns", counting)
    for _ in range(3):
        shape.phases()
        shape.rate_at(0.5)
    assert reads == []  # validation already read it; the cache serves the rest
    Path(path).write_text("0\n1\n2\n3\n")
    os.utime(path, ns=(10**18, 10**18))  # a new version of the file is read again, once
    assert shape.expected_requests == 4 and shape.expected_requests == 4 and reads == [path]
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SHAPES.validate_python({"kind": "replay", "path": path, "rate": 3})
