"""Analysis of a run's traces on DuckDB, in the order the data flows: the run read as views (read/), the operating
map (opmap/), engine steps and the step-time fit (steps/), which k each arm executed (verify/), and here the
answer, the headline, the gates and summary.json built from them. DuckDB reads and groups the rows; numpy only
sees the small aggregates it returns."""
