"""Progress of a long step, shown once.

On a terminal: one live line (a status such as "starting 2 dask workers…", then a bar) drawn by
the same rich console that prints Prefect's log lines, so log lines scroll above it instead of
tearing through it; the line is gone when the step ends (the step logs its result). The status
and the 10 % lines then go to the Prefect run log only: the bar already shows them.

Piped, in a deployment run or a worker: no live line and no colour, the status and a line every
10 % as plain log lines, each once.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from prefect.logging.handlers import PrefectConsoleHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn
from rich.theme import Theme

from h5forge._pipeline.runner import LogDisplay

SHOWN_LIVE = "h5forge_shown_live"  # log record attribute: the live line already shows this


class _NotShownLive(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, SHOWN_LIVE, False)


def terminal_log_handler() -> PrefectConsoleHandler | None:
    """Prefect's console handler when it writes to a terminal (it sits on the root logger)."""
    consoles = (h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler))
    return next((h for h in consoles if h.console.is_terminal and not h.console.is_dumb_terminal), None)


class StepDisplay(LogDisplay):
    """``status(text)`` while the step prepares, ``advance(n)`` as items are done: on the live line
    when there is one, and as log lines."""

    def __init__(self, total: int, label: str, logger, live: Progress | None) -> None:
        super().__init__(total, label, logger, {SHOWN_LIVE: live is not None})
        self.live = live
        self._bar = live.add_task(label, total=total) if live is not None else None

    def status(self, text: str) -> None:
        super().status(text)
        if self.live is not None and self._bar is not None:
            # drawn now: a status that lasts less than the live line's refresh period (workers
            # started ahead are ready at once) is otherwise never seen
            self.live.update(self._bar, description=text, refresh=True)

    def advance(self, n: int) -> None:
        if self.live is not None and self._bar is not None:
            self.live.update(self._bar, completed=self.done + n, description=self.label)
        super().advance(n)


@contextmanager
def progress(total: int, label: str, logger) -> Iterator[StepDisplay]:
    """``logger``: the run logger (its records reach the console handler and the Prefect API)."""
    handler = terminal_log_handler()
    if handler is None:
        yield StepDisplay(total, label, logger, None)
        return
    live = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=handler.console,
        transient=True,
    )
    hide = _NotShownLive()
    handler.addFilter(hide)
    handler.console.push_theme(Theme())  # Prefect's theme lacks the bar's styles; rich's defaults added
    live.start()
    try:
        yield StepDisplay(total, label, logger, live)
    finally:
        live.stop()
        handler.console.pop_theme()
        handler.removeFilter(hide)
