"""Decisions: what the evidence of a run says an operator should configure (recommend), the simulator's ground
truth it is held to (oracle, ground_truth), and the searches that go beyond the measured arms (tune, search)."""
