"""The pipeline's steps as Prefect tasks, its log in the run's log, its reports as artifacts."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any, Callable, TypeVar

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE
from prefect.exceptions import MissingContextError
from prefect.utilities.annotations import quote

from h5forge._pipeline.runner import Display, Runner
from h5forge.tasks.progress import SHOWN_LIVE, progress

T = TypeVar("T")
LIBRARY_LOGGER = "h5forge"


@lru_cache(maxsize=None)
def _task(name: str, fn: Callable) -> Any:
    return task(fn, name=name, cache_policy=NONE, persist_result=False)  # type: ignore[call-overload]  # overloads want a ParamSpec


class _ToRunLog(logging.Handler):
    """The library's records, logged again on the current flow or task run's logger (console and API)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            logger = get_run_logger()
        except MissingContextError:
            return
        extra = {SHOWN_LIVE: True} if getattr(record, SHOWN_LIVE, False) else None
        logger.log(record.levelno, record.getMessage(), extra=extra)


class PrefectRunner(Runner):
    """Each step a task run named after it; used as a context manager around the pipeline call,
    which routes the library's log into the run's log for that time."""

    shows_artifacts = True

    def __enter__(self) -> "PrefectRunner":
        self._logger = logging.getLogger(LIBRARY_LOGGER)
        self._saved = (self._logger.level, self._logger.propagate)
        self._handler = _ToRunLog()
        self._logger.addHandler(self._handler)
        self._logger.setLevel(logging.INFO)
        self._logger.propagate = False  # the run logger prints it once
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self._handler)
        self._logger.level, self._logger.propagate = self._saved

    def step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # quote: Prefect would otherwise walk every sample of an inventory looking for futures
        return _task(name, fn)(*(quote(a) for a in args), **{k: quote(v) for k, v in kwargs.items()})

    def progress(self, total: int, label: str) -> AbstractContextManager[Display]:
        return progress(total, label, logging.getLogger(LIBRARY_LOGGER))

    def markdown(self, key: str, markdown: str, description: str) -> None:
        create_markdown_artifact(key=key, markdown=markdown, description=description)

    def table(self, key: str, rows: list[dict], description: str) -> None:
        create_table_artifact(key=key, table=rows, description=description)
