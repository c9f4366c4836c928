"""`specdrill recommend`: a schedule per batch band from a run's evidence, for the operator's topology."""
