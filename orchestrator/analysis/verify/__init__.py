"""Which k each arm executed, proven from its per-step telemetry, and the findings the report says about it."""
