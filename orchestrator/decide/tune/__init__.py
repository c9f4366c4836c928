"""`specdrill tune`: the schedule (or static k) that serves a campaign's own traffic best, by the simulator."""
