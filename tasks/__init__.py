"""Prefect tasks: the pipeline's steps (``h5forge._pipeline``) run as tasks of the same names.

``PrefectRunner`` is the runner the flows hand to ``h5forge._pipeline.build`` / ``append`` /
``verify``: arrays never pass through Prefect, so no task caches or persists its result, and
tasks exchange paths and summaries only.
"""

from h5forge.tasks.runner import PrefectRunner

__all__ = ["PrefectRunner"]
