"""Tests of orchestrator/report/."""
