"""Settings for a flow run that its caller waits for in its own process (``h5forge build`` and
``h5forge append`` on the command line).

An expected failure (an ``H5forgeError``: too many rejected inputs, a full disk, a bad spec) is
said by the command in one ``error:`` line. Prefect logs it too, with its traceback and a
"Finished in state Failed" line from the run and from the task that raised it: those records
still reach the run's log on the server, but not the terminal, unless ``debug``. A bug (any
other exception) keeps its traceback on the terminal. Without ``PREFECT_API_URL`` the run goes to a temporary server that
Prefect starts as a child process writing to the same terminal; stopping it at exit cancels its
services mid-write, and each logs an error with its traceback. That child inherits the settings
of the run, so its log level is CRITICAL unless ``debug`` or the user set one: the terminal keeps
the command's one line.

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
        if "heartbeat_frequency" not in get_current_settings().flows.model_fields_set:  # unless the user asked
            stack.enter_context(temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        yield


def _expected(names: frozenset[str], record: logging.LogRecord) -> bool:
    """A record about an H5forgeError: raised in it (its traceback), or the state it left a run in."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, H5forgeError):
        return True
    message = record.getMessage()
    return "Finished in state Failed(" in message and any(
        f"{name}: " in message or f"{name}(" in message for name in names
    )


class _NotExpected(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.names = frozenset(_error_names(H5forgeError))

    def filter(self, record: logging.LogRecord) -> bool:
        return not _expected(self.names, record)


def _error_names(cls: type[BaseException]) -> Iterator[str]:
    yield cls.__name__
    for sub in cls.__subclasses__():
        yield from _error_names(sub)


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
