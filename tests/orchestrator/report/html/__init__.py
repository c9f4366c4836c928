"""Tests of orchestrator/report/html/: report.html."""
