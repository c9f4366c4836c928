"""`specdrill compare`'s two questions kept apart (issue 40), on simulated runs graded by the simulator's own
closed-batch answer (`specdrill simulate fixed-batch`, computed apart from compare): an engine slower on every
step (every cost of the shipped profile x1.08) is "the engine got slower" with its figure and no change in
speculation's benefit, so `--fail-on worse` passes and `--fail-on engine-slower` fails; a costlier verify
step (x4 per batched token) takes speculation's benefit down where the oracle says it falls, and `--fail-on
worse` fails; and a different campaign under the same arm names (other shapes, mix and schedule) is refused
for a gate, naming what differs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.orchestrator.compare.test_compare import (
    MARGIN,
    SHIPPED,
    SPLIT,
    NoCapture,
    campaign,
    compare,
    costlier_verify,
    oracle_tokens_per_s,
    simulate,
)
from tests.tiny_campaigns import cli_exit

SLOWER = 1.08  # every cost of the profile times this: every step 8% longer


def slower_engine(root: Path, factor: float) -> str:
    """A copy of the shipped profile with every cost (verify, draft, step overhead) `factor` times as large."""
    import serve_apps

    data = yaml.safe_load((Path(serve_apps.__file__).parent / "profiles" / f"{SHIPPED}.yaml").read_text())
    data["name"] = f"eagle-slower-x{factor:g}"
    for part in ("verify", "draft"):
        data[part] = {k: v * factor if isinstance(v, float) else v for k, v in data[part].items()}
    data["step_overhead"] *= factor
    path = root / f"profile-slower-x{factor:g}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compare-benefit")


@pytest.fixture(scope="module")
def base(runs: Path) -> Path:
    return simulate(NoCapture(), runs, "base", campaign(SHIPPED))  # type: ignore[arg-type]


def benefit_oracle(capsys: pytest.CaptureFixture[str], profile: str, batches: list[int]) -> dict[int, float]:
    """fixed k = 3's throughput over off's at each batch size, closed batch."""
    spec = oracle_tokens_per_s(capsys, profile, "fixed:3", batches)
    off = oracle_tokens_per_s(capsys, profile, "off", batches)
    return {b: spec[b] / off[b] for b in batches}


def test_an_engine_slower_on_every_step_is_the_engines_change_not_speculations(
    base: Path, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = slower_engine(runs, SLOWER)
    candidate = simulate(capsys, runs, "slower", campaign(profile))
    # The oracle: off's closed-batch throughput falls by the factor, and fixed k = 3's benefit does not move.
    grid = [1, 4, 8, 16]
    before, after = (oracle_tokens_per_s(capsys, p, "off", grid) for p in (SHIPPED, profile))
    assert all(after[b] / before[b] == pytest.approx(1 / SLOWER, rel=0.01) for b in grid)
    benefit_before, benefit_after = benefit_oracle(capsys, SHIPPED, grid), benefit_oracle(capsys, profile, grid)
    assert all(benefit_after[b] / benefit_before[b] == pytest.approx(1.0, abs=0.005) for b in grid)

    code, err, found = compare(capsys, str(base), str(candidate), "-o", str(runs / "out-slower"), "--fail-on", "worse")
    assert code == 0 and found is not None and found.paired, err
    judged = [b for b in found.benefit_changes if b.verdict != "not_comparable"]
    assert len(judged) >= 12 and all(b.verdict == "no_change" for b in judged), judged
    [engine] = found.engine_changes
    assert engine.arm == "off-single" and engine.verdict == "slower" and engine.slower == engine.cells >= 6
    assert engine.median == pytest.approx(1 / SLOWER, abs=0.015), engine
    assert "the engine got slower: off-single" in engine.message and f"{engine.median:.2f}x" in engine.message
    answer = found.answer
    assert answer.index("Speculation's benefit") < answer.index("The engine got slower")
    assert f"unchanged in all {len(judged)} cells comparable in both runs (within the margin)" in answer
    # the speculative arms' own cells are slower too: what `--fail-on worse` failed on before issue 40
    assert sum(c.verdict == "worse" for c in found.cells if c.arm != "off-single") >= len(judged) // 2
    code, err, found = compare(capsys, str(base), str(candidate), "-o", str(runs / "out-slower-engine"),
                               "--fail-on", "engine-slower")  # fmt: skip
    assert code == 3 and found is not None, err
    assert [line.split(":")[0] for line in found.gate_failures] == ["engine slower"]


def test_a_costlier_verify_step_takes_speculations_benefit_down_where_the_oracle_says(
    base: Path, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = costlier_verify(runs, 4.0)
    candidate = simulate(capsys, runs, "verify-x4", campaign(profile))
    out = runs / "out-x4"
    code, err, found = compare(capsys, str(base), str(candidate), "-o", str(out), "--fail-on", "worse")
    assert code == 3 and found is not None, err
    threshold = 1 / (1 + MARGIN)
    fell: dict[tuple[str, str], bool] = {}
    for b in (x for x in found.benefit_changes if x.measure == "batch_size" and x.verdict != "not_comparable"):
        low, high = b.band.split("-")
        ends = [int(low), min(int(high), 32)]
        before, after = benefit_oracle(capsys, SHIPPED, ends), benefit_oracle(capsys, profile, ends)
        changes = [after[e] / before[e] for e in ends]
        # said worse only where the oracle's benefit falls past the margin; and where it falls by 10% or more at
        # both ends of the band, said worse
        assert b.verdict != "better", b
        if b.verdict == "worse":
            assert min(changes) < threshold, (b, changes)
        if max(changes) < 0.9:
            assert b.verdict == "worse", (b, changes)
        fell[(b.band, b.arm)] = b.verdict == "worse"
    assert sum(fell.values()) >= 2, fell
    assert all(line.startswith("worse (speculation's benefit fell): ") for line in found.gate_failures)
    assert len(found.gate_failures) == 2  # one line per arm, not one per cell
    assert "Speculation's benefit (each arm's speedup over off, candidate against baseline): fell in" in found.answer
    page = (out / "compare.html").read_text()
    assert page.index("<h2>Answer</h2>") < page.index("gate failed") < page.index("<svg")
    assert page.count('class="interval"') >= 2 * len(fell) and "<script" not in page


def other_campaign() -> dict[str, Any]:
    """The same arm names on other traffic and another schedule: a busier hold, a chat mix with longer answers,
    and `split` a schedule that speculates less."""
    data = campaign(SHIPPED)
    data["shapes"]["hold"] = {"kind": "quiet", "rate": 6, "duration_s": 15}
    data["mix"]["entries"][0]["workload"] = {**data["mix"]["entries"][0]["workload"], "max_tokens": 128}
    data["policies"]["split"] = SPLIT.replace("21-512=3", "21-512=1")
    return data


def test_runs_of_different_campaigns_are_refused_for_the_gate_naming_what_differs(
    base: Path, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = simulate(capsys, runs, "other", other_campaign())
    out = runs / "out-other"
    for gate in ("worse", "any"):
        code, err = cli_exit(capsys, "compare", str(base), str(other), "-o", str(out), "--fail-on", gate)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "different traffic (shapes (hold differs); mix; the engine is the same)" in err, err
        assert not (out / "compare.json").exists()
    # without a gate: compared, with the difference said first
    code, err, found = compare(capsys, str(base), str(other), "-o", str(out))
    assert code == 0 and found is not None and not found.paired, err
    head = f"Candidate run {found.candidate_run} against baseline run {found.baseline_run}: DIFFERENT TRAFFIC"
    assert found.answer.startswith(f"{head} (shapes (hold differs); mix; the engine is the same)"), found.answer
    assert any(d.what == "policy" and d.arm == "split-single" for d in found.setup), found.setup
