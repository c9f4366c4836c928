"""`specdrill calibrate`: fit a simulator profile from a measured run's engine step timelines and per-request
speculation counters (or import vLLM's offline profiler output), and say how well the fit predicts."""
