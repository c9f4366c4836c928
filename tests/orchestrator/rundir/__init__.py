"""Tests of orchestrator/rundir/: the run directory's files, lock and evidence."""
