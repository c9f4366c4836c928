"""The operating map's measures are one table (orchestrator/analysis/opmap/measures.py): a row added there is computed
per band and arm, lands in summary.json, and is said by the console and report.html, with no other edit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.tiny_campaigns import two_shapes

# The new row reuses the requests' ttft column under another name, so its values are known exactly: the TTFT
# quantiles of the same cell (which tests/orchestrator/analysis/test_analysis_map.py checks against numpy's
# percentiles).
ADD_A_ROW = """
import importlib.util
import sys
from pathlib import Path
import orchestrator
# The table's module is loaded, and the row added, before the analysis package (whose models it shapes) imports.
path = Path(orchestrator.__file__).parent / "analysis" / "opmap" / "measures.py"
spec = importlib.util.spec_from_file_location("orchestrator.analysis.opmap.measures", path)
measures = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = measures
spec.loader.exec_module(measures)
measures.MEASURES = measures.MEASURES + (
    measures.Measure("first_token_again_s", "ttft", "FIRSTAGAIN", "ttft once more", True,
                     console=("p99",), console_rank=9, html=("p90",)),
)
from orchestrator.entry import main
sys.argv = ["specdrill", "simulate", sys.argv[1], "--output", sys.argv[2]]
main()
"""


@pytest.mark.slow
def test_a_measure_added_as_one_row_reaches_the_map_summary_console_and_html(tmp_path: Path) -> None:
    campaign = tmp_path / "c.yaml"
    campaign.write_text(two_shapes("onerow"))
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ADD_A_ROW), str(campaign), str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    cells = [c for m in summary["maps"] for c in m["cells"] if c["requests"] > 0]
    assert len(cells) >= 4 and all(c["ttft_s"]["p99"] is not None for c in cells)
    assert all(c["first_token_again_s"] == c["ttft_s"] for c in cells)
    assert "FIRSTAGAIN p99" in done.stdout
    assert "FIRSTAGAIN p90" in (out / "report.html").read_text()
