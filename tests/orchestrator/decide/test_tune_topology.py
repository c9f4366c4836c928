"""`specdrill tune` on a data-parallel campaign (issue 40): vLLM drops the per-batch schedule there and runs the
static num_speculative_tokens in every step, so the answer is the best static k, graded here against the
fixed-batch oracle at the batch sizes the DP group's engines ran, not against tune's own scores.

The campaign: the costly-verify profile (verify compute 10x the shipped one's: the oracle's best k is 4 at batch
1, 2 to ~20, 1 to ~60) on data_parallel:2, a ramp to 72 req/s in 30 s (each engine to batch ~42), its dynamic arm
with max k 4: what that arm runs under DP is k = 4 in every step, which the oracle puts beyond the margin slower
than its best static k at this load.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.analysis.steps.prediction_check import SeedRange
from orchestrator.cli import cli
from orchestrator.decide.ground_truth import costly_verify_profile, fixed_k_campaign, short_chat
from orchestrator.decide.oracle import Oracle, oracle
from orchestrator.decide.scoring import Objective
from orchestrator.decide.tune.build import Tuned
from orchestrator.decide.tune.outputs import TuneOutputs, run_tune, with_profile, write_tune
from orchestrator.decide.tune.static import static_policy, tune_on
from orchestrator.decide.tune.topology import BandFigure, StaticAnswer, TopologyTraffic, choose_topology
from orchestrator.decide.tune.words import static_lines
from orchestrator.plan.campaign import ArmSelection, Campaign, load_campaign
from tests.tune_checks import batch_weights, oracle_latency

MARGIN = MapSettings().margin
REFERENCE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def dp_campaign(root: Path) -> tuple[Path, Campaign]:
    path = root / "costly.yaml"
    path.write_text(yaml.safe_dump(costly_verify_profile()))
    data = fixed_k_campaign(path, root / "run", rate_to=72, duration_s=30)
    data["policies"] = {"off": "off", "dyn": "dynamic:4:1-4=4,5-20=2,21-512=1"}
    data["topologies"] = {"dp2": "data_parallel:2"}
    return path, Campaign.model_validate(data)


@dataclass
class DataParallel:
    tuned: Tuned
    outputs: TuneOutputs
    reference: Oracle
    latency: dict[int, float]  # the reference's per-token latency over off's at the answer's batch sizes, per static k


@pytest.fixture(scope="module")
def dp(tmp_path_factory: pytest.TempPathFactory) -> DataParallel:
    root = tmp_path_factory.mktemp("tune-dp")
    path, campaign = dp_campaign(root)
    campaign, profile, name = with_profile(campaign, str(path))
    choice = choose_topology(campaign, None)
    # The schedule set against the static k on a coarse space (edges 1, 8, 24): the alternative, not the answer.
    tuned = tune_on(campaign, profile, choice, seeds=2, edges=(1, 8, 24), budget=40)
    outputs = write_tune(campaign, tuned, profile, name, objective=Objective(), seeds=2, out_dir=root / "tune")
    ev, static = tuned.evaluator, tuned.result.static
    assert static is not None
    reference = oracle(profile, workload=short_chat(), max_k=ev.space.max_k, batch_sizes=REFERENCE_SIZES,
                       tolerance=MARGIN)  # fmt: skip
    # Where the DP group's engines ran the answer: replayed here through the virtual executor.
    group = TopologyTraffic.on(ev.traffic, choice.topology)
    weights = batch_weights(group, static_policy(static.k, ev.method, ev.model))
    assert max(weights) <= REFERENCE_SIZES[-1]  # the reference covers every batch size the traffic ran
    latency = {k: oracle_latency(reference, lambda b, k=k: k, weights) for k in range(ev.space.max_k + 1)}
    return DataParallel(tuned, outputs, reference, latency)


def test_the_answer_on_a_data_parallel_campaign_is_the_oracles_best_static_k(dp: DataParallel) -> None:
    result, static = dp.tuned.result, dp.tuned.result.static
    assert static is not None and result.topology == "data_parallel:2" and result.topology_name == "dp2"
    best = min(dp.latency, key=lambda k: dp.latency[k])
    assert dp.latency[static.k] <= dp.latency[best] * (1 + MARGIN), (static.k, dp.latency)
    # The campaign exercises the rule: the largest k (what the campaign's dynamic arm runs under DP, and what tune
    # used to answer with) is beyond the margin slower than the best static k by the oracle.
    assert best != 4 and dp.latency[4] > dp.latency[best] * (1 + MARGIN), dp.latency
    # The config vLLM gets: that k, no per-batch schedule (DP would drop it).
    assert result.speculative_config is not None
    assert result.speculative_config["num_speculative_tokens"] == static.k
    assert "num_speculative_tokens_per_batch_size" not in result.speculative_config
    assert result.schedule == [[1, 512, static.k]]


def test_the_data_parallel_answer_says_the_topology_rule_and_what_it_measured(dp: DataParallel) -> None:
    result, lines, static = dp.outputs.result, dp.outputs.lines, dp.tuned.result.static
    assert static is not None
    assert lines[0].startswith(f"answer for data_parallel:2 (dp2): static k = {static.k} in every step. Under data "
                               "parallelism vLLM drops num_speculative_tokens_per_batch_size")  # fmt: skip
    text = "\n".join(lines)
    config = yaml.safe_load(Path(dp.outputs.files["speculative-config.yaml"]).read_text())["speculative_config"]
    assert config["num_speculative_tokens"] == static.k and "num_speculative_tokens_per_batch_size" not in config
    # Where the traffic ran and what lies above it.
    reach = result.answer_reach
    assert 1 <= reach <= result.reach  # the answer's own batches: off, slower, runs larger ones
    assert f"  batch 1-512: k = {static.k}; batch 1-{reach} measured (the simulator's prediction on the campaign's " \
           f"own load); batch {reach + 1}-512: the same static k, which vLLM runs at every batch size; inherited, " \
           "not measured" in text  # fmt: skip
    # The schedule on as many replicas, set against it band by band, said whichever way it goes.
    assert len(static.figures) == len(result.bands.bands)
    if static.schedule_wins:
        assert "a schedule would beat static k" in text and "serve replicas:2 instead" in text
    else:
        assert f"no schedule beats static k = {static.k} beyond the margin at the measured load" in text
    # The rehearsal runs the answer where it will run, beside off on the same engines.
    rehearsal = load_campaign(dp.outputs.files["rehearsal-campaign.yaml"])
    arms = {a.name: a for a in rehearsal.arms()}
    assert arms["tuned-dp2"].policy.kind == "fixed" and arms["tuned-dp2"].topology.kind == "data_parallel"
    assert "off-dp2" in arms
    assert dp.outputs.prediction.tuned_arm == "tuned-dp2"


def _answer(verdicts: list[int], gain: float) -> StaticAnswer:
    figures = [BandFigure(band=f"{i}-{i + 1}", speedup=SeedRange.of([1.05, 1.06]), verdict=v)
               for i, v in enumerate(verdicts)]  # fmt: skip
    return StaticAnswer(k=2, topology="data_parallel:2", schedule_topology="replicas:2", speedups={}, figures=figures,
                        schedule_gain=gain, margin=MARGIN, beyond_reach=None)  # fmt: skip


def test_a_schedule_that_beats_the_static_k_is_said_with_the_deployment_that_keeps_it(dp: DataParallel) -> None:
    """Beyond the margin on the traffic, its bands weighted by their requests (as the static k is chosen, and as
    recommend weighs its schedule): one band faster beyond the margin is said, but decides nothing alone."""
    result = dp.tuned.result
    (wins,) = static_lines(result, _answer([0, 1], 1.03))
    assert wins.startswith("a schedule would beat static k = 2 beyond the margin at the measured load: ")
    assert "is 1.030x faster per token on the traffic (its bands weighted by their requests); beyond the margin " \
           "in 1-2 req/s (1.055 [1.050, 1.060])" in wins  # fmt: skip
    assert "data_parallel:2 cannot run it (vLLM drops it); to keep it, serve replicas:2 instead: 2 independent " \
           "engines behind a router" in wins  # fmt: skip
    (none,) = static_lines(result, _answer([0, 1], 1.012))
    assert none.startswith("no schedule beats static k = 2 beyond the margin at the measured load")
    assert "is 1.012x faster per token on the traffic (its bands weighted by their requests), within the 2% " \
           "margin" in none  # fmt: skip


def test_the_topology_is_the_campaigns_or_the_operators(tmp_path: Path) -> None:
    _, campaign = dp_campaign(tmp_path)
    assert choose_topology(campaign, None).short == "data_parallel:2"
    assert choose_topology(campaign, "single").short == "single"
    replicas = choose_topology(campaign, "replicas:2")
    assert replicas.short == "replicas:2" and not replicas.data_parallel and replicas.name == "replicas2"
    assert choose_topology(campaign, "data_parallel:2").name == "dp2"  # the campaign's own name for it
    with pytest.raises(ValueError, match=r"^--topology: topology 'dp:2': expected single, replicas:N or "):
        choose_topology(campaign, "dp:2")
    quickstart = load_campaign(str(Path(__file__).parents[3] / "campaigns" / "quickstart.yaml"))
    # dyn runs on one engine and on dp2: the data-parallel group is where a schedule would silently not run.
    assert choose_topology(quickstart, None).short == "data_parallel:2"
    assert quickstart.arms_only is not None
    both = quickstart.model_copy(update={
        "topologies": {**quickstart.topologies, "dp4": quickstart.topologies["dp2"].model_copy(update={"size": 4})},
        "arms_only": [*quickstart.arms_only, ArmSelection(policy="dyn", topology="dp4")],
    })  # fmt: skip
    assert choose_topology(both, None).short == "data_parallel:4"  # the largest, as recommend answers


def test_a_bad_topology_is_one_line_exit_2_and_nothing_written(tmp_path: Path) -> None:
    _, campaign = dp_campaign(tmp_path)
    campaign_file = tmp_path / "dp.yaml"
    campaign_file.write_text(yaml.safe_dump(campaign.model_dump(mode="json", by_alias=True, exclude_none=True)))
    out = tmp_path / "tune"
    bin_ = Path(sys.executable).parent / "specdrill"
    done = subprocess.run([str(bin_), "tune", str(campaign_file), "--topology", "data_parallel:two", "-o", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--topology: topology 'data_parallel:two': expected single, replicas:N or data_parallel:N" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()


def test_an_operators_data_parallel_topology_on_a_one_engine_campaign(tmp_path: Path) -> None:
    """`--topology data_parallel:2` where the campaign runs one engine only: the answer and its rehearsal are for
    a DP group the campaign never named (off and the answer on it, beside the campaign's own arms)."""
    path = tmp_path / "costly.yaml"
    path.write_text(yaml.safe_dump(costly_verify_profile()))
    data = fixed_k_campaign(path, tmp_path / "run", rate_to=36, duration_s=10)
    data["policies"] = {"off": "off", "fixed2": "fixed:2"}
    out = run_tune(Campaign.model_validate(data), profile=str(path), objective=Objective(), seeds=1,
                   out_dir=tmp_path / "tune", budget=2, topology="data_parallel:2")  # fmt: skip
    static = out.result.static
    assert static is not None and out.result.topology == "data_parallel:2" and out.result.topology_name == "dp2"
    assert out.lines[0].startswith(f"answer for data_parallel:2 (dp2): static k = {static.k} in every step")
    rehearsal = load_campaign(out.files["rehearsal-campaign.yaml"])
    arms = {a.name: a for a in rehearsal.arms()}
    assert {"off-single", "fixed2-single", "off-dp2"} <= set(arms)
    if static.k:
        assert arms["tuned-dp2"].topology.data_parallel_size == 2 and arms["tuned-dp2"].policy.kind == "fixed"


def test_tune_says_how_far_it_got_on_stderr_and_only_its_answer_on_stdout(tmp_path: Path) -> None:
    path = tmp_path / "costly.yaml"
    path.write_text(yaml.safe_dump(costly_verify_profile()))
    data = fixed_k_campaign(path, tmp_path / "run", rate_to=36, duration_s=10)
    data["policies"] = {"off": "off", "fixed2": "fixed:2"}
    campaign_file = tmp_path / "small.yaml"
    campaign_file.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(cli, ["tune", str(campaign_file), "--seeds", "1", "--budget", "2", "--topology",
                                      "data_parallel:2", "-o", str(tmp_path / "tune")])  # fmt: skip
    assert result.exit_code == 0, result.output
    said = result.stderr.splitlines()
    assert said[0] == "tune: playing speculation off (1 seeds of the campaign's traffic) (0 s)", said
    assert any(line.startswith("tune: building the fixed-batch oracle (") for line in said), said
    assert any(line.startswith("tune: searching schedules on replicas:2 (") for line in said), said
    assert [line.rsplit(" (", 1)[0] for line in said if "static k" in line][-1] == (
        "tune: playing 3 static k (0-2) on data_parallel:2 ... 3/3"
    ), said
    assert result.stdout.startswith("answer for data_parallel:2 (dp2): static k = ")
    assert "tune:" not in result.stdout
