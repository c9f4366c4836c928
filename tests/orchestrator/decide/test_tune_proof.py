"""specdrill tune held to issue 27's claims on a short costly-verify ramp (benchmarks/bench_tune.py at larger sizes):
against fixed k and vLLM's example schedule per offered-rate band, against exhaustive search, and the oracle gap."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml

from orchestrator.analysis.opmap.results import MapSettings
from orchestrator.analysis.steps.prediction_check import SeedRange
from orchestrator.decide.ground_truth import costly_verify_profile, fixed_k_campaign
from orchestrator.decide.oracle import Oracle, oracle
from orchestrator.decide.played import Played
from orchestrator.decide.tune.build import OFF, Tuned, tune
from orchestrator.decide.tune.outputs import with_profile
from orchestrator.plan.campaign import Campaign
from serve_apps.sim.profile import Profile
from tests.tune_checks import batch_weights, oracle_best, oracle_latency, without_effect
from tests.tune_proof import (
    GAP_LIMIT,
    VLLM_EXAMPLE_ARM,
    BandProof,
    Gap,
    Versus,
    better_somewhere,
    comparison_arms,
    k_at,
    oracle_gaps,
    versus,
    worst_gap,
)

MARGIN = MapSettings().margin


# The independent reference: the fixed-batch oracle called here (not the object tune starts from), at its own batch
# sizes to 64 (above the traffic's reach, ~49; each larger one costs seconds). The same seed as tune's: on seed 1
# the oracle's own best k at batch 2 moves from 3 to 4 (1.476 -> 1.527 over off), more than the 3-point limit.
REFERENCE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass
class Proof:
    campaign: Campaign
    profile: Profile
    tuned: Tuned
    arms: dict[str, Played]
    proofs: list[BandProof]
    reference: Oracle


@pytest.fixture(scope="module")
def proof(tmp_path_factory: pytest.TempPathFactory) -> Proof:
    root = tmp_path_factory.mktemp("tune-proof")
    path = root / "costly.yaml"
    path.write_text(yaml.safe_dump(costly_verify_profile()))
    data = fixed_k_campaign(path, root / "run", rate_to=36, duration_s=30)
    data["policies"].pop("bands")
    campaign, profile, _ = with_profile(Campaign.model_validate(data), str(path))
    tuned = tune(campaign, profile, seeds=2)
    ev = tuned.evaluator
    arms = comparison_arms(ev.traffic, ev.method, ev.model, ev.space.max_k)
    workload = max(campaign.mix.entries, key=lambda e: e.weight).resolved()
    reference = oracle(profile, workload=workload, max_k=ev.space.max_k, batch_sizes=REFERENCE_SIZES,
                       tolerance=MARGIN)  # fmt: skip
    proofs = versus(ev.played[OFF], ev.played[tuned.result.winner], arms, ev.bands)
    return Proof(campaign, profile, tuned, arms, proofs, reference)


def test_the_tuned_schedule_is_no_worse_than_the_best_fixed_k_or_vllms_example_in_any_band(proof: Proof) -> None:
    assert proof.tuned.result.scored_bands == list(range(len(proof.proofs)))  # paired scores: no band left out
    for band in proof.proofs:
        assert band.no_worse_than_best(MARGIN), (band.band, band.rows[band.best_fixed].text())
        assert not band.rows[VLLM_EXAMPLE_ARM].worse(MARGIN), (band.band, band.rows[VLLM_EXAMPLE_ARM].text())


def test_the_tuned_schedule_beats_each_comparison_somewhere(proof: Proof) -> None:
    missing = [arm for arm in proof.arms if not better_somewhere(proof.proofs, arm, MARGIN)]
    assert missing == []


def test_the_right_k_changes_by_batch_range_and_the_tuned_schedule_follows_the_oracle_there(proof: Proof) -> None:
    """Graded by the fixed-batch oracle called here, at the batch sizes the tuned schedule's own traffic ran
    (replayed through the virtual executor): in each batch range where the oracle's best k holds and the load
    spends at least a tenth of its request-steps, the schedule's per-token latency by the oracle is within the
    margin of the best k's. The ramp needs more than one k: every fixed k is beyond the margin in some range."""
    ev, result = proof.tuned.evaluator, proof.tuned.result
    weights = batch_weights(ev.traffic, ev.policy_of(result.winner))
    assert max(weights) <= REFERENCE_SIZES[-1]
    total, top = sum(weights.values()), proof.profile.limits.max_num_seqs
    ranges: list[dict[int, float]] = []
    best_of = [oracle_best(proof.reference, b) for b in weights]
    for (b, w), best, before in zip(weights.items(), best_of, [None, *best_of], strict=False):
        if best != before:
            ranges.append({})
        ranges[-1][b] = w
    ranges = [r for r in ranges if sum(r.values()) >= 0.1 * total]
    assert len({oracle_best(proof.reference, min(r)) for r in ranges}) >= 2, "the oracle's best k changes by range"

    def latency(k_of: Callable[[int], int], part: dict[int, float]) -> float:
        return oracle_latency(proof.reference, k_of, part)

    def best_latency(part: dict[int, float]) -> float:
        return latency(lambda b: oracle_best(proof.reference, b), part)

    for part in ranges:
        tuned = latency(lambda b: k_at(result.schedule, b, top), part)
        assert tuned <= best_latency(part) * (1 + MARGIN), (min(part), max(part), tuned, best_latency(part))
    for k in range(ev.space.max_k + 1):
        worst = max(latency(lambda b, k=k: k, part) / best_latency(part) for part in ranges)
        assert worst > 1 + MARGIN, (k, worst)


def test_the_tuned_k_is_within_three_points_of_an_independent_oracles_best_at_every_batch_size(proof: Proof) -> None:
    # Graded against the oracle called here (its own batch sizes), not the one tune started from.
    top = proof.profile.limits.max_num_seqs
    gaps = oracle_gaps(proof.reference, proof.tuned.result.schedule, top, up_to=REFERENCE_SIZES[-1])
    assert [g.batch for g in gaps] == list(range(1, 65))
    assert [(g.batch, round(g.gap, 3)) for g in gaps if g.gap > GAP_LIMIT] == []
    # At each measured batch size, the tuned k is the reference's best or ties it within its tolerance, or gives
    # up less than the limit (between two of tune's own measured sizes the k of the one below holds).
    for point in proof.reference.points:
        k = min(k_at(proof.tuned.result.schedule, point.batch_size, top), proof.reference.max_k)
        given_up = point.tpot_p50_s[0] / point.tpot_p50_s[point.best_k] - point.tpot_p50_s[0] / point.tpot_p50_s[k]
        assert k in point.near_best or given_up <= GAP_LIMIT, (point.batch_size, k, point.near_best, given_up)


def test_no_k_change_without_a_predicted_effect_is_emitted(proof: Proof) -> None:
    """Every k change of the tuned schedule within the traffic's reach has a predicted effect beyond the margin
    (tests/tune_checks.py: on the played traffic, or at the independent oracle's batch sizes)."""
    ev, result = proof.tuned.evaluator, proof.tuned.result
    assert result.schedule is not None and not result.stopped_by_budget
    found = without_effect(ev.traffic, ev.method, ev.model, result.schedule, ev.played[result.winner], result.reach,
                           ev.bands, proof.reference, proof.profile.limits.max_num_seqs, MARGIN)  # fmt: skip
    assert found, "the costly-verify ramp's schedule changes k within the reach: the property is exercised"
    assert [merged for merged, by in found if not by] == []
    assert any(by == "traffic" for _, by in found), found  # the traffic's side is exercised, not only the oracle's


def test_worst_gap_is_the_largest_the_first_batch_on_a_tie() -> None:
    gaps = [Gap(batch=b, k=1, best_k=2, gap=g) for b, g in ((1, 0.01), (2, 0.04), (3, 0.04), (4, 0.0))]
    assert worst_gap(gaps).batch == 2


def test_versus_reads_per_seed_intervals() -> None:
    faster = Versus(band="0-5", arm="fixed1", speedup=SeedRange.of([1.05, 1.03]), goodput=SeedRange.of([1.0, 1.0]))
    assert faster.better(MARGIN) and not faster.worse(MARGIN)
    mixed = Versus(band="0-5", arm="fixed1", speedup=SeedRange.of([1.05, 0.99]), goodput=SeedRange.of([1.0, 1.0]))
    assert not mixed.better(MARGIN) and not mixed.worse(MARGIN)
    short = Versus(band="0-5", arm="fixed1", speedup=SeedRange.of([1.05, 1.04]), goodput=SeedRange.of([0.9, 0.95]))
    assert short.worse(MARGIN) and not short.better(MARGIN)


def test_oracle_gaps_interpolate_between_measured_batch_sizes() -> None:
    from orchestrator.decide.oracle import OraclePoint

    def point(batch: int, tpot: dict[int, float]) -> OraclePoint:
        best = min(tpot, key=lambda k: (tpot[k], k))
        return OraclePoint(batch_size=batch, tpot_p50_s=tpot, tokens_per_s=tpot, mean_batch=tpot, best_k=best,
                           margin=0.0, near_best=(best,))  # fmt: skip

    truth = Oracle(profile="p", workload="w", method="eagle", max_k=1, seed=0, tolerance=0.02,
                   points=(point(1, {0: 1.0, 1: 0.5}), point(3, {0: 1.0, 1: 1.5})))  # fmt: skip
    gaps = oracle_gaps(truth, [[1, 512, 1]], 512, up_to=4)
    # batch 2: k = 1's latency interpolates to 1.0, a tie with off (ties to the smaller k: 0 is best, no gap)
    assert [(g.batch, g.best_k) for g in gaps] == [(1, 1), (2, 0), (3, 0), (4, 0)]
    assert gaps[0].gap == 0 and gaps[1].gap == pytest.approx(0.0)
    assert gaps[2].gap == pytest.approx(1 - 1 / 1.5)
