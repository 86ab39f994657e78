"""The pipeline as plain Python: ``build(spec)``, ``append(spec)`` and ``verify(out)``.

Each states its steps' order once; the Prefect flows (``flows/``) run the same functions with
each step as a task (``h5forge.tasks.PrefectRunner``).
"""

from h5forge._pipeline.append import append
from h5forge._pipeline.build import build
from h5forge._pipeline.results import AppendResult, BuildResult
from h5forge._pipeline.runner import Runner
from h5forge._pipeline.verify import verify

__all__ = ["append", "build", "verify", "AppendResult", "BuildResult", "Runner"]
