"""Engine steps and the step-time fit: the steps as arrays, the model and its fit, k-switch cost, timelines,
the prediction check."""
