"""`specdrill run` in virtual time: the simulated engine's twins, the traffic played into them, the trace rows
they give, and the executor the runner (orchestrator.execute.runner) runs units with."""
