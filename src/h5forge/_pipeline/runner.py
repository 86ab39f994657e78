"""How the pipeline runs its steps.

``build`` and ``append`` (this package) state the order of the steps once. Each step goes through
a ``Runner``: this one calls it plainly (notebooks, tests, benchmarks); the Prefect flows in
``flows/`` pass ``h5forge.tasks.PrefectRunner``, which runs each step as a task of the same name
and shows the reports as artifacts. Steps log to the ``h5forge`` logger.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Protocol, TypeVar

T = TypeVar("T")

log = logging.getLogger("h5forge._pipeline")


class Display(Protocol):
    """Progress of a long step: ``status`` while it prepares, ``advance`` as inputs are settled."""

    def status(self, text: str) -> None: ...

    def advance(self, n: int) -> None: ...


class LogDisplay:
    """The status, then a log line every 10 %, on ``logger`` with ``extra`` on each record."""

    def __init__(self, total: int, label: str, logger: logging.Logger = log, extra: dict | None = None) -> None:
        self.total, self.label, self.done, self._next = total, label, 0, 0.1
        self.logger, self.extra = logger, extra

    def status(self, text: str) -> None:
        self.logger.info(text, extra=self.extra)

    def advance(self, n: int) -> None:
        self.done += n
        if self.total and self.done / self.total >= self._next:
            percent = 100 * self.done // self.total
            self.logger.info("%s: %d/%d (%d %%)", self.label, self.done, self.total, percent, extra=self.extra)
            while self._next <= self.done / self.total:
                self._next += 0.1


class Runner:
    """Runs each step as a plain call; reports go to the output folder's files only."""

    shows_artifacts = False  # a runner that shows reports elsewhere (Prefect artifacts) says so

    def step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs)

    def progress(self, total: int, label: str) -> AbstractContextManager[Display]:
        return nullcontext(LogDisplay(total, label))

    def markdown(self, key: str, markdown: str, description: str) -> None:
        """A Markdown report of the run (a plain run keeps its reports in files)."""

    def table(self, key: str, rows: list[dict], description: str) -> None:
        """A table report of the run."""


PLAIN = Runner()
