"""Prefect tasks: thin wrappers over h5forge steps (logging, progress, artifacts)."""
