"""vLLM 0.33+'s skip_drafts steps (model runner V2: no drafts proposed in a step where no scheduled request can use
them) replayed as the engine records them: stat-logger steps into the step timeline, the timeline file written as a
unit writes it, then the executed-policy check over the run directory. Skip steps are counted apart and are never a
mismatch; a real mismatch beside them still fails; a dropped schedule is still reported dropped; timelines without
the column (vLLM 0.32, V1, older runs) read as no skip steps. No vLLM 0.33 or 0.34 engine ever ran here: the
records follow the wheels' code (scheduler.py 0.33:502-544, gpu/model_runner.py 0.33:2117-2135)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loadshapes.trace import TraceWriter
from orchestrator.analysis.opmap.results import ArmVerification
from orchestrator.analysis.read.arms import ArmInfo
from orchestrator.analysis.read.views import run_requests
from orchestrator.analysis.verify.executed import verify_executed_policy
from orchestrator.report.build import finding_lines
from orchestrator.rundir.unit_files import timeline_table
from serve_apps.engines.step_timeline import StepStats, StepTimeline, drafts_unused
from serve_apps.policies import DynamicPolicy
from tests.orchestrator.analysis.test_analysis_inputs import START_NS, trace_table

SCHEDULE = ((1, 64, 3), (65, 128, 1), (129, 512, 0))
POLICY = DynamicPolicy(method="eagle", model="d", max_k=3, schedule=SCHEDULE)
ARM = ArmInfo.from_policy("dyn-v2", POLICY)
CONFIG = json.dumps({"method": "eagle", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": SCHEDULE})
DROPPED = json.dumps({"method": "eagle", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": None})
BATCHES = (4, 10, 40, 60, 70, 100, 120, 8, 90, 30)  # k 3 and 1 of the schedule, several times each
TABLE = ARM.k_table()


def _stats(
    end: float, batch: int, *, prefills: int = 0, first_tokens: int = 0, verified_k: int | None = None,
    finished_at_length: int = 0,
) -> StepStats:  # fmt: skip
    """One step as vLLM 0.33's stat logger reports it: `verified_k` drafts per decoding request verified in it
    (proposed by the previous step; None: none verified), `finished_at_length` requests ending at max_tokens."""
    decodes = batch - prefills
    drafting = decodes if verified_k else 0
    return StepStats(
        rank=0, end=end, elapsed_s=0.01, scheduled=batch, prefills=prefills, decodes=decodes, waiting=0, running=batch,
        num_drafts=drafting, drafted=drafting * (verified_k or 0), accepted=0, k_scheduled=int(TABLE[batch]),
        batched_tokens=None, kv_tokens=None, first_token_latencies=[0.5] * first_tokens,
        finished=[f"r{end}-{i}" for i in range(finished_at_length)], finished_at_length=finished_at_length,
    )  # fmt: skip


def _v2_steps(*, skip_every: int = 4, planted_every: int = 0) -> tuple[list[StepStats], int]:
    """Steps cycling through BATCHES. Every `skip_every`-th step is a skip_drafts step: every request samples its
    last token (vLLM proposes no drafts, so the next step's decoding requests verify none: the timeline's k of the
    skip step is 0 though its k_scheduled is 3 or 1). Every `planted_every`-th other step is followed by a step that
    verifies no drafts although the step could use them: a real mismatch. Returns the steps and the skip count."""
    steps: list[StepStats] = []
    previous_k: int | None = None
    skips = 0
    others = 0
    for i in range(400):
        batch = BATCHES[i % len(BATCHES)]
        skip = i % skip_every == 1
        steps.append(_stats(float(i), batch, verified_k=previous_k, finished_at_length=batch if skip else 0))
        if skip:
            skips += 1
            previous_k = None  # nothing proposed: the next step's decoding requests verify no drafts (k = 0)
        else:
            others += 1
            planted = planted_every and others % planted_every == 0
            previous_k = None if planted else int(TABLE[batch])
    return steps, skips


def _timeline(steps: Sequence[StepStats], *, can_skip_drafts: bool) -> StepTimeline:
    timeline = StepTimeline(speculative=True, can_skip_drafts=can_skip_drafts)
    for step in steps:
        timeline.record(step)
    return timeline


def _run_dir(root: Path, units: dict[str, StepTimeline], *, config: str = CONFIG, dropped: bool = False) -> list:
    """A run directory holding one unit per shape: its trace part file and its step timeline file, written as the
    engine's timeline reaches the unit (StepTimeline.since -> unit_files.timeline_table)."""
    keys = []
    for shape, timeline in units.items():
        n = 40
        rows = trace_table(
            arm=[ARM.name] * n, shape=[shape] * n, scheduled_ns=[START_NS + i * 10**8 for i in range(n)],
            unit_start_ns=[START_NS] * n, request_id=[f"{ARM.name}:{shape}:0:{i}" for i in range(n)],
            step_batch_size=[[4, 70]] * n, step_k=[[3, 1]] * n, per_step_drafted=[[3, 1]] * n,
            resolved_speculative_config=[config] * n, schedule_dropped=[dropped] * n,
        )  # fmt: skip
        writer = TraceWriter(str(root / "traces"), writer_id=f"{ARM.name}-{shape}-r0-w")
        for row in rows.to_pylist():
            writer.append(row)
        writer.close()
        directory = root / "timelines" / f"arm={ARM.name}" / f"shape={shape}"
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(timeline_table({f"{ARM.name}/0": timeline.since(0)}), directory / "r0.parquet")
        keys.append((ARM.name, shape, 0))
    return keys


def _verify(root: Path, units: dict[str, StepTimeline], **kwargs: object) -> ArmVerification:
    keys = _run_dir(root, units, **kwargs)  # type: ignore[arg-type]
    requests = run_requests(str(root), keys)
    try:
        (result,) = verify_executed_policy(requests, [ARM]).arms
    finally:
        requests.close()
    return result


def _messages(result: ArmVerification, check: str) -> list[str]:
    return [f.message for f in result.findings if f.check == check]


def test_the_skip_condition_is_vllms_recomputed_from_the_step() -> None:
    # non-final prefill chunks only (context requests, no first token): skip
    assert drafts_unused(_stats(0.0, 4, prefills=4))
    # every request sampled its last token (finished at max_tokens): skip
    assert drafts_unused(_stats(0.0, 4, finished_at_length=4))
    # a final prefill chunk samples its first token and will verify drafts next step: no skip
    assert not drafts_unused(_stats(0.0, 4, prefills=4, first_tokens=1))
    # one decoding request goes on: no skip; nothing scheduled: no step to skip
    assert not drafts_unused(_stats(0.0, 4, prefills=1, finished_at_length=2))
    assert not drafts_unused(_stats(0.0, 0))


def test_skip_steps_are_marked_and_left_out_of_request_steps_only_where_vllm_can_skip() -> None:
    steps, skips = _v2_steps()
    v2 = _timeline(steps, can_skip_drafts=True)
    rows = v2.since(0)
    assert sum(rows["drafts_skipped"]) == skips == 100
    marked = [i for i, s in enumerate(rows["drafts_skipped"]) if s]
    assert {rows["k"][i] for i in marked} == {0} and min(rows["k_scheduled"][i] for i in marked) > 0
    batches, ks = v2.request_steps(0, 399, first_token_latency=None, decode_steps=399)
    assert len(ks) == 399 - skips and all(k == TABLE[b] for b, k in zip(batches, ks, strict=True))
    # vLLM 0.32 (no skip_drafts), model runner V1, n-gram methods: no column, steps as before
    old = _timeline(steps, can_skip_drafts=False)
    assert "drafts_skipped" not in old.since(0)
    assert "drafts_skipped" not in timeline_table({"e": old.since(0)}).column_names
    assert timeline_table({"e": rows}).column("drafts_skipped").to_pylist() == rows["drafts_skipped"]


def test_skip_steps_are_counted_apart_and_never_a_mismatch(tmp_path: Path) -> None:
    steps, skips = _v2_steps()
    result = _verify(tmp_path / "v2", {"s": _timeline(steps, can_skip_drafts=True)})
    assert result.passed and result.steps == 400 - skips - 1  # the last step's k is never told
    assert result.match_fraction == 1.0
    said = f"{skips} steps skipped drafts (vLLM 0.33+ V2: no scheduled request could use them); left out of the " \
        "executed-k check"  # fmt: skip
    assert said in _messages(result, "telemetry")
    # the console says it under the arm's verdict too, beside the last step's k, which no later step tells
    assert finding_lines(result) == ["[note] 1 engine step reported no executed k; left out", f"[note] {said}"]
    # The same steps without the column (as the verifier saw them before): the skip steps' k = 0 is a mismatch.
    blind = _verify(tmp_path / "blind", {"s": _timeline(steps, can_skip_drafts=False)})
    assert not blind.passed and blind.match_fraction == pytest.approx(1 - skips / 399)


def test_a_real_mismatch_beside_skip_steps_still_fails(tmp_path: Path) -> None:
    steps, skips = _v2_steps(planted_every=10)
    result = _verify(tmp_path, {"s": _timeline(steps, can_skip_drafts=True)})
    assert not result.passed
    (executed,) = [f for f in result.findings if f.check == "executed_k"]
    assert not executed.passed
    # the planted k = 0 steps stay in (30, less the last step's, whose k no step tells); only the skip steps are out
    assert result.steps == 400 - skips - 1 and result.match_fraction == pytest.approx(1 - 29 / 299)
    assert any(m.startswith(f"{skips} steps skipped drafts") for m in _messages(result, "telemetry"))


def test_a_dropped_schedule_is_still_reported_dropped(tmp_path: Path) -> None:
    steps, _ = _v2_steps()
    result = _verify(tmp_path, {"s": _timeline(steps, can_skip_drafts=True)}, config=DROPPED, dropped=True)
    assert not result.passed
    (dropped,) = [f for f in result.findings if f.check == "schedule_dropped"]
    assert not dropped.passed and "schedule_dropped on 40 of 40 requests" in dropped.message


def test_a_timeline_without_the_column_reads_as_no_skip_steps_beside_one_with_it(tmp_path: Path) -> None:
    steps, skips = _v2_steps()
    plain, _ = _v2_steps(skip_every=10**9)  # no skip steps at all, written without the column (vLLM 0.32)
    units = {"new": _timeline(steps, can_skip_drafts=True), "old": _timeline(plain, can_skip_drafts=False)}
    result = _verify(tmp_path, units)
    assert result.passed and result.steps == (400 - skips - 1) + 399
    assert any(m.startswith(f"{skips} steps skipped drafts") for m in _messages(result, "telemetry"))


def test_a_remote_run_directory_reads_the_column_as_a_local_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps view of a run on object storage reads each timeline with Arrow (not DuckDB's union_by_name)."""
    import pyarrow.fs as pafs

    from orchestrator.analysis.read import views as run_views

    steps, skips = _v2_steps()
    plain, _ = _v2_steps(skip_every=10**9)
    keys = _run_dir(
        tmp_path, {"new": _timeline(steps, can_skip_drafts=True), "old": _timeline(plain, can_skip_drafts=False)}
    )
    local = run_requests(str(tmp_path), keys)
    try:
        expected = verify_executed_policy(local, [ARM])
    finally:
        local.close()
    # Not a LocalFileSystem: the branch run directories on S3 or GCS take
    monkeypatch.setattr(run_views, "filesystem", lambda d: (pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()), d))
    remote = run_requests(str(tmp_path), keys)
    try:
        counts = remote.con.execute(
            "SELECT shape, count(*) FILTER (WHERE drafts_skipped) FROM steps GROUP BY ALL ORDER BY 1"
        ).fetchall()
        report = verify_executed_policy(remote, [ARM])
    finally:
        remote.close()
    assert counts == [("new", skips), ("old", 0)] and report == expected and report.passed
