"""The operating map: load bands, the latency measures per band and arm, ratios with intervals, verdicts, k evidence."""
