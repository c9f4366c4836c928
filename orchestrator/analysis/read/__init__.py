"""A run read as DuckDB views: the run's files, its trace and step views, its arms, telemetry and fault windows."""
