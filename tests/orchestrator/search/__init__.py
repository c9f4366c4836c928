"""Tests of orchestrator/search/: the crossover search in virtual time, on Ray, on endpoints and on vLLM."""
