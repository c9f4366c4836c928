"""compare.json and compare.html, written where asked (a local directory or a run directory's URI)."""

from __future__ import annotations

from orchestrator.compare.html import render_compare_html
from orchestrator.compare.model import Comparison
from orchestrator.rundir.layout import RunStore

COMPARE_JSON, COMPARE_HTML = "compare.json", "compare.html"


def write_comparison(comparison: Comparison, directory: str) -> str:
    store = RunStore(directory, create=True)
    store.write_text(COMPARE_HTML, render_compare_html(comparison))
    store.write_json(COMPARE_JSON, comparison.model_dump(mode="json"))
    return store.root
