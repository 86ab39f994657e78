"""Incremental builds: the raw-file hash cache, what a rebuild reuses, and resuming a killed build."""
