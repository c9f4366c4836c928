"""Execution: the one unit loop, the Ray executor, load workers, deployment, endpoint scraping, progress and signals."""
