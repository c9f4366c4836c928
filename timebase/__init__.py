"""What every specdrill component shares and owns nothing else of: the one clock (timebase.clock)."""
