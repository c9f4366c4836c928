"""Tests of orchestrator/execute/: the unit loop, the Ray executor, load workers, deploy, endpoints, signals."""
