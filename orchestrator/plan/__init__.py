"""The campaign and its plan: the file's model, the baselines each arm is measured against, the run's size, warnings."""
