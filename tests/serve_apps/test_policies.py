from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_apps.policies import (
    DynamicPolicy,
    FixedPolicy,
    OffPolicy,
    PolicyError,
    Topology,
    dense_schedule,
    parse_policy,
    policy_from_dict,
    split_policy_list,
    validate_schedule,
)


def reference_k(schedule: list[tuple[int, int, int]], batch: int, max_k: int) -> int:
    """Independent reference: the last range (by start) that starts at or below the batch size decides."""
    chosen = [k for start, _end, k in sorted(schedule) if start <= batch][-1]
    return min(chosen, max_k)


@st.composite
def schedules(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    n = draw(st.integers(1, 6))
    entries = []
    start = 1
    for _ in range(n):
        end = start + draw(st.integers(0, 80))
        entries.append((start, end, draw(st.integers(0, 8))))
        start = end + 1 + draw(st.integers(0, 40))  # gaps are allowed and inherit
    return draw(st.permutations(entries))  # vLLM sorts entries; order must not matter


@given(schedules(), st.integers(1, 8), st.integers(1, 600))
@settings(max_examples=300, deadline=None)
def test_lookup_matches_reference(schedule: list[tuple[int, int, int]], max_k: int, max_batch: int) -> None:
    ordered = validate_schedule([list(e) for e in schedule])
    table = dense_schedule(ordered, max_batch, max_k)
    assert len(table) == max_batch + 1
    for batch in range(1, max_batch + 1):
        assert table[batch] == reference_k(schedule, batch, max_k)


@given(schedules(), st.integers(1, 8))
@settings(max_examples=100, deadline=None)
def test_data_parallel_runs_the_static_k(schedule: list[tuple[int, int, int]], max_k: int) -> None:
    policy = DynamicPolicy(method="ngram", max_k=max_k, schedule=tuple(sorted(schedule)))
    dp = policy.resolve(Topology(kind="data_parallel", size=2))
    assert dp.schedule is None and dp.schedule_dropped
    assert all(k == max_k for k in dp.k_table(300)[1:])
    replicas = policy.resolve(Topology(kind="replicas", size=4))
    assert replicas.schedule == policy.schedule and not replicas.schedule_dropped


def test_doc_example_lookup() -> None:
    policy = parse_policy("dynamic:3:1-64=3,65-128=1,129-512=0", default_method="eagle", default_model="drafter")
    resolved = policy.resolve()
    assert [resolved.k_for_batch(b, 512) for b in (1, 64, 65, 128, 129, 512)] == [3, 3, 1, 1, 0, 0]
    assert policy.to_vllm_speculative_config() == {
        "method": "eagle",
        "model": "drafter",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 128, 1], [129, 512, 0]],
    }


def test_gap_tail_and_clamp() -> None:
    table = dense_schedule(validate_schedule([[1, 16, 5], [32, 40, 2]]), 50, 3)
    assert table[1:17] == [3] * 16  # clamped to max k 3
    assert table[17:32] == [3] * 15  # gap inherits the previous k
    assert table[32:41] == [2] * 9
    assert table[41:] == [2] * 10  # tail inherits the last k


def test_all_zero_schedule_is_dynamic_not_off() -> None:
    policy = parse_policy("dynamic:ngram:2:1-512=0", default_method="eagle", default_model="m")
    assert isinstance(policy, DynamicPolicy)
    resolved = policy.resolve()
    assert resolved.method == "ngram" and resolved.num_speculative_tokens == 2
    assert resolved.k_for_batch(1, 512) == 0
    assert policy.to_vllm_speculative_config()["num_speculative_tokens_per_batch_size"] == [[1, 512, 0]]
    assert OffPolicy().to_vllm_speculative_config() is None


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([[2, 10, 3]], "schedule entry [2, 10, 3]: the first batch-size range must start at 1"),
        ([[1, 10, 3], [5, 20, 1]], "schedule entries [1, 10, 3] and [5, 20, 1] overlap"),
        ([[1, 10, -1]], "schedule entry 0 [1, 10, -1]: k must be >= 0"),
        ([[1, 10, 3], [30, 20, 1]], "schedule entry 1 [30, 20, 1]: start 30 is greater than end 20"),
        ([[0, 10, 3]], "schedule entry 0 [0, 10, 3]: batch-size range must be positive"),
        ([[1, 10]], "schedule entry 0 [1, 10]: must be [start, end, k] with three integers"),
        ([], "schedule must be a non-empty list"),
    ],
)
def test_schedule_errors_name_the_entry(schedule: list[list[int]], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_dict({"kind": "dynamic", "method": "ngram", "max_k": 3, "schedule": schedule})
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_overlap_detected_after_sorting_like_vllm() -> None:
    with pytest.raises(PolicyError, match="overlap"):
        validate_schedule([[20, 30, 1], [1, 25, 3]])
    assert validate_schedule([[20, 30, 1], [1, 19, 3]]) == ((1, 19, 3), (20, 30, 1))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "fixed", "method": "eagle", "k": 3}, "method 'eagle' needs a drafter model"),
        ({"kind": "fixed", "method": "ngram", "model": "x", "k": 3}, "takes no drafter model"),
        ({"kind": "fixed", "method": "ngram", "k": 0}, "k: Input should be greater than or equal to 1"),
        ({"kind": "fixed", "method": "nope", "k": 2}, "method"),
        (
            {"kind": "fixed", "method": "ngram", "k": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
            "prompt_lookup_min 5 is greater than prompt_lookup_max 2",
        ),
        (
            {"kind": "fixed", "method": "eagle", "model": "m", "k": 2, "prompt_lookup_max": 2},
            "n-gram methods only",
        ),
        ({"kind": "maybe"}, "does not match any of the expected tags"),
    ],
)
def test_policy_errors(data: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_dict(data)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_parse_short_forms() -> None:
    fixed = parse_policy("fixed:3", default_method="eagle", default_model="d")
    assert fixed == FixedPolicy(method="eagle", model="d", k=3)
    ngram = parse_policy("fixed:ngram:4", default_method="eagle", default_model="d")
    assert ngram.to_vllm_speculative_config() == {"method": "ngram", "num_speculative_tokens": 4}
    assert parse_policy("off", default_method="eagle", default_model=None) == OffPolicy()
    for bad in ("fixed", "fixed:x", "dynamic:3", "dynamic:3:1-4", "sometimes:3", "off:1"):
        with pytest.raises(PolicyError):
            parse_policy(bad, default_method="eagle", default_model="d")


def test_split_policy_list_keeps_schedule_commas() -> None:
    assert split_policy_list("off,fixed:3,dynamic:3:1-64=3,65-128=1,129-512=0,fixed:ngram:2") == [
        "off",
        "fixed:3",
        "dynamic:3:1-64=3,65-128=1,129-512=0",
        "fixed:ngram:2",
    ]


def test_topology() -> None:
    assert Topology().data_parallel_size == 1
    assert Topology(kind="data_parallel", size=4).data_parallel_size == 4
    assert Topology(kind="replicas", size=4).data_parallel_size == 1
    with pytest.raises(ValueError, match="exactly one engine"):
        Topology(kind="single", size=2)
