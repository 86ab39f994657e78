"""Prefect tasks: thin wrappers over h5forge steps (logging, progress, artifacts).

Every task is declared through ``step``: arrays never pass through Prefect, so no task caches or
persists its result, and tasks exchange paths and summaries only.
"""

from __future__ import annotations

from functools import partial

from prefect import task
from prefect.cache_policies import NONE

step = partial(task, cache_policy=NONE, persist_result=False)
