"""Settings for a flow run that its caller waits for in its own process (``h5forge build`` and
``h5forge append`` on the command line).

An expected failure (an ``H5forgeError``: too many rejected inputs, a full disk, a bad spec) is
said by the command in one ``error:`` line. Prefect logs it too, with its traceback and a
"Finished in state Failed" line from the run and from the task that raised it: those records
still reach the run's log on the server, but not the terminal, unless ``debug`` (a filter on
Prefect's console handlers, keyed on the exception a record carries and the run it belongs to). A bug (any
other exception) keeps its traceback on the terminal. Without ``PREFECT_API_URL`` the run goes to a temporary server that
Prefect starts as a child process writing to the same terminal; stopping it at exit cancels its
services mid-write, and each logs an error with its traceback: Prefect's own loggers through the
server log level, which the child inherits from the run's settings, and other libraries' (the
database pool's) through the root logger, whose level the child reads from its environment
(``PREFECT_LOGGING_ROOT_LEVEL``). Both are CRITICAL unless ``debug`` or the user set them: the
terminal keeps the command's one line.

Prefect 3.9 emits a flow-run heartbeat event every ``flows.heartbeat_frequency`` seconds (180 by
default) from a thread that sleeps in 1 s steps, and joins that thread when the run ends: every run
waits up to 1 s (0.5 s on average) for nothing. The heartbeats only matter to an automation that
marks silent runs as crashed, and a foreground command's user sees its crash on the console. So a
foreground run sends none unless the heartbeat frequency was set explicitly (environment, profile or
prefect.toml); runs of deployments (the nightly build, watch folders) never come through here and
keep Prefect's default.
"""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack, contextmanager
from typing import Iterator

from h5forge.errors import H5forgeError


@contextmanager
def foreground_run(debug: bool = False) -> Iterator[None]:
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_SERVER_LOGGING_LEVEL,
        get_current_settings,
        temporary_settings,
    )

    with ExitStack() as stack:
        if not debug:
            stack.enter_context(_expected_failures_off_the_terminal())
            if "logging_level" not in get_current_settings().server.model_fields_set:  # unless the user asked
                stack.enter_context(temporary_settings(updates={PREFECT_SERVER_LOGGING_LEVEL: "CRITICAL"}))
            if not get_current_settings().api.url:  # a temporary server starts in the block
                stack.enter_context(_environment_default(ROOT_LEVEL, "CRITICAL"))
        if "heartbeat_frequency" not in get_current_settings().flows.model_fields_set:  # unless the user asked
            stack.enter_context(temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        yield


ROOT_LEVEL = "PREFECT_LOGGING_ROOT_LEVEL"  # Prefect's override of its logging config's root level


@contextmanager
def _environment_default(name: str, value: str) -> Iterator[None]:
    """Within the block, ``name`` is ``value`` in the environment of the processes it starts, unless
    the user set it."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


class _NotExpected(logging.Filter):
    """Drops the records of a run that failed with an H5forgeError: the one carrying the error and
    the run's later ones (its final "Failed" state), told apart by the run ids Prefect's run loggers
    put on each record. Records of other runs and of bugs pass."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        run = getattr(record, "task_run_id", None) or getattr(record, "flow_run_id", None)
        if record.exc_info and isinstance(record.exc_info[1], H5forgeError):
            if run is not None:
                self.failed.add(run)
            return False
        return run is None or run not in self.failed


@contextmanager
def _expected_failures_off_the_terminal() -> Iterator[None]:
    from prefect.logging.handlers import PrefectConsoleHandler

    quiet = _NotExpected()
    handlers = {
        h for name in ("", "prefect") for h in logging.getLogger(name).handlers if isinstance(h, PrefectConsoleHandler)
    }
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)
