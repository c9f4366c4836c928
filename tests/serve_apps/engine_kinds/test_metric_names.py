"""A server's Prometheus names live in its dialect's module (serve_apps/engine_kinds/dialects/<dialect>.py) and
nowhere else in the product: a second copy of `vllm:num_requests_running` in a finding or a scraper would stay
vLLM's when another server's dialect is read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests import REPO

PRODUCT = ("orchestrator", "serve_apps", "loadshapes", "timebase")
# `vllm:spec_decode...`, `sglang:num_running_reqs`: a Prometheus name with the engine's namespace prefix;
# TensorRT-LLM's have a `trtllm_` prefix instead (its metric families, not every word starting so: a policy may
# be named trtllm_schedule).
METRIC_NAME = re.compile(
    r"\b(vllm|sglang|trtllm|tensorrt_llm):[a-z_]+"
    r"|\btrtllm_(spec_decode|num_requests|generation_tokens|prompt_tokens|avg_decoded|scheduled_batch|speculative_config)"
)
DIALECTS = REPO / "serve_apps" / "engine_kinds" / "dialects"


def metric_names_outside_dialects(paths: list[Path], root: Path = REPO) -> list[str]:
    """String constants (docstrings aside: they explain) holding a metric name, outside the kinds' modules."""
    found = []
    for path in paths:
        if path.parent == DIALECTS:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and id(node) not in docstrings else None
            if isinstance(text, str) and (match := METRIC_NAME.search(text)):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {match.group(0)}")
    return found


def test_metric_names_live_in_the_kinds_dialects_only() -> None:
    paths = sorted(p for package in PRODUCT for p in (REPO / package).rglob("*.py"))
    found = metric_names_outside_dialects(paths)
    assert not found, (
        "Prometheus names outside serve_apps/engine_kinds/dialects/ (read them from the kind's dialect):\n"
        + ("\n".join(found))
    )


def test_the_check_finds_a_name_in_a_message_and_not_in_a_docstring(tmp_path: Path) -> None:
    module = tmp_path / "finding.py"
    module.write_text(
        '"""Reads vllm:num_requests_running."""\nMESSAGE = "batch from /metrics vllm:num_requests_running"\n'
    )
    assert metric_names_outside_dialects([module], tmp_path) == ["finding.py:2: vllm:num_requests_running"]


def test_the_check_finds_a_tensorrt_llm_name_and_not_a_policy_named_like_one(tmp_path: Path) -> None:
    module = tmp_path / "scrape.py"
    module.write_text('DRAFTS = "trtllm_spec_decode_num_draft_tokens_total"\nPOLICY = "trtllm_schedule"\n')
    assert metric_names_outside_dialects([module], tmp_path) == ["scrape.py:1: trtllm_spec_decode"]
