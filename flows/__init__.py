"""Prefect flows: wiring of the tasks, one file per flow."""
