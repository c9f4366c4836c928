"""The run directory's data model: units, manifest, lock, evidence; written by the executors, read by the
analysis, importing no runtime module."""
