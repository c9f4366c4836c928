"""TensorRT-LLM's stateless load-dependent rules: `draft_len_schedule` (both key semantics) and `max_concurrency`.

Read from TensorRT-LLM's stored main (2026; the PyPI package is a placeholder and the wheels live on NVIDIA's
index, so not installed here):
- `lower_bounds` (two-model drafter, PR #8194; the config comment's `{1: 4, 4: 2, 8: 0}`): the largest key <= the
  batch size wins (tensorrt_llm/_torch/speculative/drafter.py, Drafter.get_draft_len_for_batch_size:
  bisect_right - 1; below the smallest key 0). llm_args.py's validator wants key 1, equal to max_draft_len.
- `upper_bounds` (one-model EAGLE3/MTP, PR #10860): the smallest key >= the batch size wins, above every key 0
  (tensorrt_llm/_torch/speculative/utils.py, get_draft_len_for_batch_size: bisect_left; `{4: 4, 8: 2, 32: 1}` =
  1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0).
- `max_concurrency` (drafter.py, Drafter.should_use_spec_decode): speculation on while min(active requests,
  max_batch_size, max_num_tokens // (1 + max_total_draft_tokens)) <= max_concurrency; not combinable with a
  schedule. "Batch size" is len(active_requests) on the rank; the simulated engine uses the step's scheduled
  requests, as it does for vLLM.
Both are tables by batch size: the simulated engine runs them as it runs vLLM's schedule.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right


def schedule_k(schedule: dict[int, int], keys: str, batch_size: int) -> int:
    """The draft length for one batch size; `keys` is "lower_bounds" or "upper_bounds"."""
    thresholds = sorted(schedule)
    if keys == "lower_bounds":
        idx = bisect_right(thresholds, batch_size)
        return 0 if idx == 0 else schedule[thresholds[idx - 1]]
    idx = bisect_left(thresholds, batch_size)
    return schedule[thresholds[idx]] if idx < len(thresholds) else 0


def schedule_table(schedule: dict[int, int], keys: str, max_num_seqs: int) -> list[int]:
    return [0] + [schedule_k(schedule, keys, b) for b in range(1, max_num_seqs + 1)]


def max_concurrency_table(max_concurrency: int, max_k: int, max_num_seqs: int, max_num_tokens: int) -> list[int]:
    """should_use_spec_decode per batch size: k = max_k while the effective request count <= max_concurrency."""
    token_cap = max_num_tokens // (1 + max_k)
    table = [0]
    for b in range(1, max_num_seqs + 1):
        effective = min(b, max_num_seqs, token_cap)
        table.append(max_k if token_cap > 0 and effective <= max_concurrency else 0)
    return table
