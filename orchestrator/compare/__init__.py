"""`specdrill compare`: what moved between two runs (set-up, cells, verdicts, crossovers, executed policy) and the
release gate on it. build.py is the pipeline; the cells' statistics are orchestrator/compare/cells.py's."""
