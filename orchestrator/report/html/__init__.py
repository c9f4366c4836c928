"""report.html: one self-contained page (inline CSS and SVG, no JavaScript, nothing fetched) for a finished run.

`render_report_html(data)` is a pure function of `ReportData`: the caller gathers the operating maps, the
executed-policy verification, the engines' step timelines and the manifest, and writes the returned text.
Import both from here. Inside: page.py assembles the page from the sections (maps.py, verification.py), whose
charts (charts.py) are drawn with a small SVG toolkit (svg.py); text.py holds the shared HTML fragments. The
data is reduced before it gets here (orchestrator/analysis/steps/timelines.py buckets the engine timelines).
"""

from orchestrator.report.html.page import ReportData, render_report_html

__all__ = ["ReportData", "render_report_html"]
