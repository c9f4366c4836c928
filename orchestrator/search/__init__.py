"""`specdrill search`: the adaptive crossover search, its unit source for the loop, and the search.json it writes."""
